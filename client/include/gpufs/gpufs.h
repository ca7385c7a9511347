/* libgpufs: map gpufs blobs into this process's GPU address space, zero-copy.
 *
 *   struct gpufs_buffer buf;
 *   if (gpufs_map("/gpu/model/w", &buf) == 0) {
 *     kernel<<<...>>>((const float*)buf.ptr, buf.size / 4);
 *     gpufs_unmap(&buf);
 *   }
 *
 * Every function returns 0 on success or a negative errno value (and sets
 * errno); gpufs_last_error() describes the last failure of the calling thread.
 *
 * Devices are matched by UUID, so CUDA_VISIBLE_DEVICES may differ between the
 * daemon and this process. Each arena is opened once per process
 * (cudaIpcOpenMemHandle) and closed at the last unmap of a blob in it. A
 * buffer keeps its member open, so the daemon frees nothing still mapped,
 * also when the member is removed or replaced meanwhile.
 *
 * Thread-safe. Uses the CUDA driver API and the device's primary context, so
 * pointers are valid in the CUDA runtime, PyTorch, CuPy and JAX alike. A
 * process that forks after mapping must not use the mappings in the child.
 */
#ifndef GPUFS_GPUFS_H_
#define GPUFS_GPUFS_H_

#include <stddef.h>
#include <stdint.h>

#include "gpufs/uapi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GPUFS_BUFFER_WRITABLE 1u /* made by gpufs_create and not sealed yet */

struct gpufs_buffer {
  void* ptr;           /* device pointer to the blob's first byte */
  uint64_t size;       /* bytes */
  int device;          /* CUDA ordinal of the blob's GPU in this process */
  int fd;              /* the open member; owned by the buffer */
  uint32_t flags;      /* GPUFS_BUFFER_* */
  uint64_t blob_id;
  uint64_t generation;
  void* internal;      /* libgpufs's bookkeeping; do not touch */
};

/* Maps the sealed GPU blob at `path` (read-only by contract: blobs are
 * immutable). -ENODEV: in host memory or on a GPU this process cannot see;
 * -EBUSY: still being written; -ENOENT, -EACCES: as open(2). */
int gpufs_map(const char* path, struct gpufs_buffer* buf);

/* A member's tensor description, as gpufs_map_described reads it: the
 * values of user.gpufs.dtype and user.gpufs.shape, NUL-terminated; a length
 * is -1 when that attribute is not set. */
struct gpufs_description {
  int32_t dtype_len;
  int32_t shape_len;
  char dtype[64];
  char shape[4096];
};

/* gpufs_map, and the member's tensor description read meanwhile (its two
 * attribute requests overlap the blob's import), for bindings that need both
 * (Python's gpufs.open). -ERANGE when a value does not fit in `desc` (then
 * nothing stays mapped). */
int gpufs_map_described(const char* path, struct gpufs_buffer* buf,
                        struct gpufs_description* desc);

/* Like gpufs_map for a member already open (fd is duplicated, not taken). */
int gpufs_map_fd(int fd, struct gpufs_buffer* buf);

/* Maps a handle obtained elsewhere (e.g. from getxattr by another process)
 * for the member at `path`: refused with -ESTALE if it no longer describes
 * that member's current blob (replaced, or the daemon restarted since). */
int gpufs_map_handle(const char* path, const struct gpufs_ipc_info* info,
                     struct gpufs_buffer* buf);

/* Creates (or replaces) the member at `path` as a new GPU blob of `size`
 * bytes, mapped writable: write it with kernels, then gpufs_seal. A blob
 * released unsealed (gpufs_unmap before gpufs_seal, or the process dying) is
 * discarded, never served half-written. A new member appears at `path` at
 * once (maps of it answer EBUSY until the seal); an existing one is replaced
 * only at gpufs_seal (readers see the old member until then). */
int gpufs_create(const char* path, uint64_t size, struct gpufs_buffer* buf);

/* Waits for the device's pending work, then seals the blob. The buffer stays
 * mapped, read-only: the driver refuses writes through it once this returns
 * (also when it fails after the wait). */
int gpufs_seal(struct gpufs_buffer* buf);

/* Copies n bytes into a writable buffer (made by gpufs_create, not yet
 * sealed) at `offset`, from host memory or from device memory (any pointer
 * CUDA's unified addressing knows: cudaMalloc, PyTorch, CuPy, JAX). Pageable
 * host memory goes through pinned staging buffers, pipelined. Synchronous.
 * -EPERM on a sealed buffer, -EINVAL past its end. */
int gpufs_write(struct gpufs_buffer* buf, uint64_t offset, const void* src, uint64_t n);

/* Copies n bytes of a mapped blob at `offset` into host or device memory. */
int gpufs_read(const struct gpufs_buffer* buf, uint64_t offset, void* dst, uint64_t n);

/* DLPack export for language bindings: a DLManagedTensor (dlpack.h, legacy
 * ABI) viewing `buf`'s blob as a C-contiguous tensor of `ndim` dimensions
 * `shape` and DLPack dtype (code, bits, lanes) on kDLCUDA. It holds a mapping
 * of its own (the member is opened again), released by its deleter, which is
 * plain C: a consumer may free the tensor at any time, even while the process
 * exits, without calling back into the binding. NULL on failure
 * (gpufs_last_error); shape x itemsize must equal the blob's size. */
void* gpufs_dlpack_export(const struct gpufs_buffer* buf, uint8_t code, uint8_t bits,
                          uint16_t lanes, int32_t ndim, const int64_t* shape);

/* A destructor for a Python "dltensor" PyCapsule holding a tensor of
 * gpufs_dlpack_export (PyCapsule_Destructor; Python's C API is looked up in
 * the process). It runs the tensor's deleter when no consumer took the
 * capsule (a consumer renames it "used_dltensor"). Plain C, so that a capsule
 * freed while the interpreter shuts down never calls into freed Python code. */
void gpufs_dlpack_capsule_destructor(void* capsule);

/* Releases the mapping and closes the member. Safe on a zeroed buffer. */
int gpufs_unmap(struct gpufs_buffer* buf);

/* Reads the handle of the member at `path` without mapping it. */
int gpufs_get_ipc_info(const char* path, struct gpufs_ipc_info* info);

/* ---- Objects as a whole ---------------------------------------------------
 * A model of hundreds of tensors is one request each way: gpufs_map_object
 * maps every sealed GPU member of an object the caller may open (each of
 * the object's allocations imported and mapped once), and
 * gpufs_object_create ... gpufs_object_commit writes an object as one
 * allocation and publishes it in one step (readers see the whole new object
 * or the old one; a writer that dies or aborts leaves nothing). */

/* One member of a mapped object. Pointers stay valid until
 * gpufs_unmap_object. */
struct gpufs_member_map {
  const char* name;      /* relative to the object ("sub/w" in a nested object) */
  void* ptr;             /* device pointer to its first byte; NULL: skipped */
  uint64_t size;
  uint64_t blob_id;
  const char* dtype;     /* user.gpufs.dtype, "" when unset */
  const uint64_t* shape; /* ndim dimensions */
  int32_t ndim;          /* -1: no user.gpufs.shape */
  int32_t error;         /* skipped: why (EACCES: not the caller's to open; EBUSY:
                            not sealed; ENODEV: not in GPU memory) */
  const char* why;       /* skipped: why, in words; "" otherwise */
  uint32_t flags;        /* GPUFS_INFO_PRIVATE_COPY: this process's own copy */
  int device;            /* CUDA ordinal of its GPU in this process */
};

struct gpufs_object_map {
  uint32_t count;                   /* members described: mapped first, then skipped */
  uint32_t mapped;
  struct gpufs_member_map* members;
  int fd;                           /* the open object; owned by the map */
  uint64_t generation;
  void* internal;                   /* libgpufs's bookkeeping; do not touch */
};

/* Maps every sealed GPU member under the object at `path` that the caller
 * may open. Members of an object that is one allocation are pointers into
 * one mapping. -ENOTDIR: not an object; -ENOTTY: not on a gpufs mount. */
int gpufs_map_object(const char* path, struct gpufs_object_map* map);
/* Releases every mapping of `map` and closes the object. Safe on a zeroed map. */
int gpufs_unmap_object(struct gpufs_object_map* map);

/* One allocation of a mapped object as this process maps it. */
struct gpufs_mapped_range {
  void* base;      /* device pointer to its first byte */
  uint64_t bytes;  /* mapped bytes */
  int device;      /* CUDA ordinal of its GPU in this process */
  uint32_t flags;  /* GPUFS_INFO_PRIVATE_COPY: this process's own copy */
};

/* Where the mapped members of `map` lie, for a framework that views them
 * as parts of one buffer per allocation (one storage, not one per member):
 * fills ranges[0 .. min(max, n)) with its n allocations and, unless NULL,
 * alloc_of[0 .. map->count) with each member's allocation (UINT32_MAX for a
 * skipped member). Every byte of a range may be opened by the caller (an
 * allocation holds only members of one owner, group and mode; a removed
 * member's range reads as zeros). Returns n, or -errno (-EINVAL: not a map
 * made by gpufs_map_object). */
int gpufs_object_map_ranges(const struct gpufs_object_map* map, struct gpufs_mapped_range* ranges,
                            uint32_t max, uint32_t* alloc_of);

/* A member of an object to write. */
struct gpufs_object_spec {
  const char* name;
  uint64_t size;
  const char* dtype;     /* NULL or "": none */
  const uint64_t* shape;
  int32_t ndim;          /* -1: no shape */
};

struct gpufs_object_writer {
  void* base;              /* device pointer to the object's allocation (offset 0);
                              NULL on a mount without a GPU */
  uint64_t bytes;          /* of the layout */
  uint32_t count;
  const uint64_t* offsets; /* of each member in the allocation (GPUFS_OBJECT_ALIGN) */
  int device;              /* CUDA ordinal, -1 without a GPU */
  int fd;                  /* the staging member; owned by the writer */
  void* internal;
};

/* Starts writing the object `path` (its parent object must exist) with
 * `count` members, `type` its user.gpufs.type (NULL: none). Fill it with
 * kernels at base + offsets[i], gpufs_object_copy or gpufs_object_copy_file,
 * then gpufs_object_commit. -EINVAL: a bad member (the daemon's log says
 * which); -ENOSPC: no room. */
int gpufs_object_create(const char* path, const struct gpufs_object_spec* members, uint32_t count,
                        const char* type, struct gpufs_object_writer* w);
/* Copies members[i] from srcs[i] (bytes[i], its whole size): device or host
 * memory; sources CUDA knows are copied together on one stream, waited for
 * once. -EINVAL: a member named twice in one call. */
int gpufs_object_copy(struct gpufs_object_writer* w, uint32_t count, const uint32_t* members,
                      const void* const* srcs, const uint64_t* bytes);
/* Copies members[i] from file `fd` at file_offsets[i] (its whole size),
 * with parallel reads overlapping the copies to the GPU. */
int gpufs_object_copy_file(struct gpufs_object_writer* w, int fd, uint32_t count,
                           const uint32_t* members, const uint64_t* file_offsets);
/* Sets the object's field `name` (a user attribute, "user." + name) to
 * `value`, before it is published. */
int gpufs_object_set_field(struct gpufs_object_writer* w, const char* name, const char* value);
/* Waits for the device's work, seals every member and puts the object at
 * its path (flags GPUFS_SEAL_REPLACE: in place of the object or member
 * there, if the caller may remove it, else -EACCES / -EPERM; without the
 * flag -EEXIST). The writer is closed either way. */
int gpufs_object_commit(struct gpufs_object_writer* w, uint32_t flags);
/* Gives up: nothing of the object stays. Safe on a zeroed writer. */
int gpufs_object_abort(struct gpufs_object_writer* w);

/* The calling thread's last error, as text ("" if none). */
const char* gpufs_last_error(void);

/* Number of arenas this process has open (for tests and diagnostics). */
int gpufs_open_arenas(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GPUFS_GPUFS_H_ */
