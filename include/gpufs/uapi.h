/* gpufs user API: the binary interface between the gpufs daemon and the
 * processes that map its blobs. C, stable: fields are only ever appended, with
 * GPUFS_UAPI_VERSION bumped; the struct size is part of each ioctl number.
 *
 *   int fd = open("/gpu/model/w", O_RDONLY);
 *   struct gpufs_ipc_info info;
 *   ioctl(fd, GPUFS_IOC_MAP, &info);     // or getxattr "user.gpufs.ipc_handle"
 *   // cudaIpcOpenMemHandle(&base, handle, ...) on the device whose UUID is
 *   // info.device_uuid; the blob is at base + info.offset, info.size bytes.
 *
 * Keep fd open while the memory is in use: an open file keeps the daemon from
 * freeing the blob, also after it is removed or replaced. libgpufs
 * (gpufs/gpufs.h) does all of this for you.
 */
#ifndef GPUFS_UAPI_H_
#define GPUFS_UAPI_H_

#include <linux/ioctl.h>
#include <stdint.h>

#define GPUFS_MAGIC 0x46555047u /* "GPUF" in memory order */
#define GPUFS_UAPI_VERSION 1u

/* The xattr that holds a struct gpufs_ipc_info (binary) on a GPU blob. */
#define GPUFS_XATTR_IPC_HANDLE "user.gpufs.ipc_handle"

struct gpufs_ipc_info {
  uint32_t magic;          /* GPUFS_MAGIC */
  uint32_t version;        /* GPUFS_UAPI_VERSION */
  uint8_t handle[64];      /* cudaIpcMemHandle_t of the arena holding the blob */
  uint64_t offset;         /* of the blob inside that arena */
  uint64_t size;           /* of the blob, in bytes */
  uint8_t device_uuid[16]; /* the GPU, by UUID: ordinals differ between processes */
  uint64_t blob_id;        /* the daemon's id of the blob (stable while it lives) */
  uint64_t generation;     /* changes when the daemon restarts */
};

/* GPUFS_IOC_ALLOC: on a member just created (O_CREAT|O_TRUNC, opened for
 * writing), reserve `size` bytes of device memory for it; `info` comes back
 * filled so that the caller can map the blob and write it in place. */
struct gpufs_alloc {
  uint64_t size;               /* in */
  struct gpufs_ipc_info info;  /* out */
};

/* Handle of a sealed GPU blob. ENODEV: the blob is in host memory. EBUSY: it
 * is still being written (not sealed after a short wait). */
#define GPUFS_IOC_MAP _IOR('G', 1, struct gpufs_ipc_info)
/* Reserve device memory for an empty unsealed blob. EPERM: sealed or not
 * opened for writing. EEXIST: already has bytes. ENOSPC: no room. */
#define GPUFS_IOC_ALLOC _IOWR('G', 2, struct gpufs_alloc)
/* Seal the blob now. Writes after it: EPERM. A blob given device memory by
 * GPUFS_IOC_ALLOC must be sealed this way: released unsealed, it is discarded
 * (its producer died or gave up). Blobs written with write(2) are sealed by
 * their last close. */
#define GPUFS_IOC_SEAL _IO('G', 3)

#endif /* GPUFS_UAPI_H_ */
