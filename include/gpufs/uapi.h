/* gpufs user API: the binary interface between the gpufs daemon and the
 * processes that map its blobs. C, stable: fields are only ever appended, with
 * GPUFS_UAPI_VERSION bumped; the struct size is part of each ioctl number.
 *
 *   int fd = open("/gpu/model/w", O_RDONLY);
 *   struct gpufs_ipc_info info;
 *   ioctl(fd, GPUFS_IOC_MAP, &info);     // or getxattr "user.gpufs.ipc_handle"
 *
 * info.handle_type says how to reach the memory:
 * - GPUFS_HANDLE_VMM_FD (the default): the blob is one CUDA VMM physical
 *   allocation of info.alloc_size bytes. Connect a SOCK_SEQPACKET Unix socket
 *   to the daemon's fd socket: $GPUFS_SOCKET if set (a container that
 *   bind-mounts it elsewhere), else the path in info.handle (NUL-terminated;
 *   the daemon puts it there when it is shorter than 64 bytes), else the
 *   path in the xattr GPUFS_XATTR_SOCKET of the mount's root. Send a struct
 *   gpufs_fd_request carrying info.token, and receive a struct
 *   gpufs_fd_reply with the allocation's POSIX fd attached (SCM_RIGHTS).
 *   Then cuMemImportFromShareableHandle(fd,
 *   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), cuMemAddressReserve +
 *   cuMemMap(alloc_size) and cuMemSetAccess with CU_MEM_ACCESS_FLAGS_PROT_READ
 *   (PROT_READWRITE only for GPUFS_INFO_WRITABLE, i.e. GPUFS_IOC_ALLOC). The
 *   blob is at base + info.offset, info.size bytes. A token is good for one
 *   request, by the same uid (and process, or a thread of it) that made the
 *   ioctl, while the file it was issued on stays open, for
 *   GPUFS_TOKEN_TTL_SECONDS; the daemon checks SO_PEERCRED. The allocation
 *   holds that blob and, for a small sealed blob, only other sealed blobs
 *   that exactly the same callers can open (same object, owner, group and
 *   mode: a pack); the rest of it is zero. The access flags are the
 *   importer's: the driver cannot stop a holder of the fd from mapping it
 *   writable, so PROT_READ protects against accidents, not a hostile reader.
 *   One round trip fewer (GPUFS_IOC_MAP_PUSH): connect first, send a struct
 *   gpufs_fd_hello with a random cookie, then ask with GPUFS_IOC_MAP_PUSH
 *   and that cookie; when the reply's info.flags has GPUFS_INFO_FD_SENT, the
 *   struct gpufs_fd_reply and the fd are already waiting on the connection
 *   (the token was spent on it and is zero). Without the flag, redeem
 *   info.token as above. A process that has not mapped yet finds the socket
 *   before any request through GPUFS_SOCKET_DIR.
 *   No ioctl at all (what libgpufs does for a map by path): on a connection
 *   that said hello, send a struct gpufs_fd_arm naming the member (st_ino
 *   from a stat) and the calling thread, then open the member read-only in
 *   that thread: the daemon answers that open after sending a struct
 *   gpufs_fd_mapped (the blob's info, its token spent, and the fd) with the
 *   arm's seq. Nothing there once open returns (the member is not a sealed
 *   GPU blob, or was replaced since the stat, or the daemon does not know
 *   arms): ask with GPUFS_IOC_MAP_PUSH. A new arm on a connection replaces
 *   its last; drain what a connection holds before arming it again.
 * - GPUFS_HANDLE_LEGACY (daemon started with --ipc legacy): info.handle is a
 *   cudaIpcMemHandle_t of an allocation holding only this blob;
 *   cudaIpcOpenMemHandle(&base, handle, ...), blob at base + info.offset.
 * The GPU is the one whose UUID is info.device_uuid.
 *
 * Keep fd open while the memory is in use: an open file keeps the daemon from
 * freeing the blob, also after it is removed or replaced. libgpufs
 * (gpufs/gpufs.h) does all of this for you.
 *
 * Version 1 (120 bytes, no handle type, legacy handles only) is no longer
 * answered: its ioctls fail with EPROTONOSUPPORT, and the daemon logs why.
 */
#ifndef GPUFS_UAPI_H_
#define GPUFS_UAPI_H_

#include <linux/ioctl.h>
#include <stdint.h>

#define GPUFS_MAGIC 0x46555047u /* "GPUF" in memory order */
#define GPUFS_UAPI_VERSION 2u

/* The xattr that holds a struct gpufs_ipc_info (binary) on a GPU blob. */
#define GPUFS_XATTR_IPC_HANDLE "user.gpufs.ipc_handle"
/* On the mount's root: the path of the daemon's fd socket (text). */
#define GPUFS_XATTR_SOCKET "user.gpufs.socket"

/* gpufs_ipc_info.handle_type */
#define GPUFS_HANDLE_VMM_FD 1u  /* token for the fd socket; handle[] is its path or zero */
#define GPUFS_HANDLE_LEGACY 2u  /* handle[] is a cudaIpcMemHandle_t */
/* gpufs_ipc_info.flags */
#define GPUFS_INFO_WRITABLE 1u  /* the producer's mapping (GPUFS_IOC_ALLOC) */
#define GPUFS_INFO_FD_SENT 2u   /* GPUFS_IOC_MAP_PUSH: the fd is on the caller's connection */
/* A reader's private copy of the allocation (a caller who may not write the
 * member never gets the shared one: an importer can always map an fd
 * writable). What the caller writes into it reaches nobody else. */
#define GPUFS_INFO_PRIVATE_COPY 4u
/* A private copy still being made (only where the request asked with
 * GPUFS_MAP_QUEUED_COPY): import and map it, then GPUFS_IOC_COPY_WAIT on
 * the member before reading it. Until then it reads as zeros or the
 * member's bytes, never anything else. */
#define GPUFS_INFO_COPY_PENDING 8u
/* In info.flags of a GPUFS_IOC_MAP_PUSH request: the caller waits for a
 * private copy itself (GPUFS_IOC_COPY_WAIT), so the daemon may answer as
 * soon as the copy is under way and the caller imports and maps the copy
 * while its bytes land. Other requests and daemons ignore it. */
#define GPUFS_MAP_QUEUED_COPY 0x100u
/* A private copy still being made whose answer came with its fd on the
 * connection (GPUFS_INFO_FD_SENT, asked with GPUFS_MAP_COPY_SIGNAL or
 * GPUFS_FD_ARM_COPY_SIGNAL): the message with the copy's fd carries a second
 * fd, a sealed memfd the caller may map read-only (the daemon's signal
 * page), and info.handle holds a struct gpufs_copy_signal in place of the
 * socket's path. The GPU writes `value` to the uint32_t at `offset` in that
 * memfd once the copy's bytes are all there (after a system-wide fence), so
 * the caller waits with no request to the daemon. Poll it a bounded time
 * only, then fall back to GPUFS_IOC_COPY_WAIT, which also says when the copy
 * failed or the worker that queued it was replaced (EIO): such a signal may
 * never come. The page holds other copies' signals too (nothing secret:
 * when a copy landed); nobody but the daemon can write it. */
#define GPUFS_INFO_COPY_SIGNAL 16u
struct gpufs_copy_signal {
  uint64_t offset; /* of a naturally aligned uint32_t in the memfd */
  uint32_t value;  /* what it holds once the copy is whole */
  uint32_t reserved;
};
/* In info.flags of a GPUFS_IOC_MAP_PUSH request, with GPUFS_MAP_QUEUED_COPY:
 * a private copy's completion may come as GPUFS_INFO_COPY_SIGNAL. */
#define GPUFS_MAP_COPY_SIGNAL 0x200u

/* Where a daemon running as root registers its fd socket: a symbolic link
 * named MAJOR:MINOR (decimal, of the mount's st_dev) to the socket. Trust it
 * only while the directory is owned by root and writable by nobody else.
 * Absent (other daemons, containers without it): use the other ways above. */
#define GPUFS_SOCKET_DIR "/run/gpufs"

#define GPUFS_TOKEN_BYTES 32
#define GPUFS_TOKEN_TTL_SECONDS 30

struct gpufs_ipc_info {
  uint32_t magic;          /* GPUFS_MAGIC */
  uint32_t version;        /* GPUFS_UAPI_VERSION */
  uint8_t handle[64];      /* legacy: cudaIpcMemHandle_t of the allocation holding the blob;
                              VMM: the fd socket's path, NUL-terminated, or all zero */
  uint64_t offset;         /* of the blob inside that allocation */
  uint64_t size;           /* of the blob, in bytes */
  uint8_t device_uuid[16]; /* the GPU, by UUID: ordinals differ between processes */
  uint64_t blob_id;        /* the daemon's id of the blob (stable while it lives) */
  uint64_t generation;     /* changes when the daemon restarts */
  /* version 2 */
  uint32_t handle_type;    /* GPUFS_HANDLE_* */
  uint32_t flags;          /* GPUFS_INFO_* */
  uint64_t alloc_size;     /* bytes of the allocation holding the blob (map them all) */
  uint8_t token[GPUFS_TOKEN_BYTES]; /* VMM: single-use, for struct gpufs_fd_request */
};

/* The fd socket (SOCK_SEQPACKET, one message each way per request; several
 * requests may share a connection). */
#define GPUFS_FD_MAGIC 0x44465047u /* "GPFD" */
struct gpufs_fd_request {
  uint32_t magic;   /* GPUFS_FD_MAGIC */
  uint32_t version; /* GPUFS_UAPI_VERSION */
  uint8_t token[GPUFS_TOKEN_BYTES];
};
/* Sent first on a connection that will take fds for GPUFS_IOC_MAP_PUSH; not
 * answered. The cookie is the connection's name in those ioctls: random,
 * and used only by the process that connected. */
#define GPUFS_FD_HELLO_MAGIC 0x4f4c4548u /* "HELO" */
struct gpufs_fd_hello {
  uint32_t magic;   /* GPUFS_FD_HELLO_MAGIC */
  uint32_t version; /* GPUFS_UAPI_VERSION */
  uint8_t cookie[GPUFS_TOKEN_BYTES];
};
/* GPUFS_FD_ARM: the sender's next read-only open of member `ino` by thread
 * `tid` (a thread of the process that connected, by gettid(); a process in
 * another PID namespace than the daemon's never matches and asks with the
 * ioctl) brings its map; not answered. ino 0 disarms. With
 * GPUFS_FD_ARM_QUEUED_COPY in seq, a private copy (the map of a caller who
 * may not write the member) comes as GPUFS_MAP_QUEUED_COPY brings it with
 * the ioctl: its info has GPUFS_INFO_COPY_PENDING, and GPUFS_IOC_COPY_WAIT on
 * the opened file waits for its bytes; without it the open returns once the
 * copy is whole. */
#define GPUFS_FD_ARM_QUEUED_COPY 0x80000000u
/* With GPUFS_FD_ARM_QUEUED_COPY in seq: the copy's completion may come as
 * GPUFS_INFO_COPY_SIGNAL, as GPUFS_MAP_COPY_SIGNAL asks with the ioctl (the
 * signal page's fd after the copy's in the struct gpufs_fd_mapped). */
#define GPUFS_FD_ARM_COPY_SIGNAL 0x40000000u
#define GPUFS_FD_ARM_MAGIC 0x4d524147u /* "GARM" */
struct gpufs_fd_arm {
  uint32_t magic;   /* GPUFS_FD_ARM_MAGIC */
  uint32_t version; /* GPUFS_UAPI_VERSION */
  uint64_t ino;
  uint32_t tid;
  uint32_t seq;     /* echoed in the struct gpufs_fd_mapped it brings, flag and all */
};
#define GPUFS_FD_MAPPED_MAGIC 0x5050414du /* "MAPP" */
struct gpufs_fd_mapped {
  uint32_t magic;              /* GPUFS_FD_MAPPED_MAGIC */
  uint32_t seq;                /* the arm's */
  struct gpufs_ipc_info info;  /* flags has GPUFS_INFO_FD_SENT; the fd is attached */
};
struct gpufs_fd_reply {
  uint32_t magic;     /* GPUFS_FD_MAGIC */
  int32_t error;      /* 0, or an errno: EACCES (wrong uid/process), ENOENT
                         (unknown, used or expired token, or the file it was
                         issued on was closed), EPROTO (malformed request) */
  uint64_t blob_id;   /* as in the info the token came with */
  uint64_t alloc_size;
  char message[112];  /* why, when error != 0 (NUL-terminated) */
};

/* GPUFS_IOC_ALLOC: on a member just created (O_CREAT|O_TRUNC, opened for
 * writing), reserve `size` bytes of device memory for it; `info` comes back
 * filled so that the caller can map the blob and write it in place. */
struct gpufs_alloc {
  uint64_t size;               /* in */
  struct gpufs_ipc_info info;  /* out */
};

/* GPUFS_IOC_MAP_PUSH: GPUFS_IOC_MAP, and the fd sent at once on the caller's
 * connection to the fd socket named by `cookie` (see the top), in a struct
 * gpufs_fd_reply; with GPUFS_INFO_COPY_SIGNAL in the answer, the signal
 * page's fd follows the blob's in that message. */
struct gpufs_map_push {
  uint8_t cookie[GPUFS_TOKEN_BYTES]; /* in: as in the connection's gpufs_fd_hello */
  struct gpufs_ipc_info info;        /* out; in: flags may have GPUFS_MAP_QUEUED_COPY,
                                        GPUFS_MAP_COPY_SIGNAL */
};

/* Handle of a sealed GPU blob (one that spilled off its GPU is brought back
 * first). ENODEV: the blob lives in host memory. EBUSY: it is still being
 * written (answered at once; nothing waits for the seal). */
#define GPUFS_IOC_MAP _IOR('G', 1, struct gpufs_ipc_info)
/* Reserve device memory for an empty unsealed blob. EPERM: sealed or not
 * opened for writing. EEXIST: already has bytes. ENOSPC: no room. */
#define GPUFS_IOC_ALLOC _IOWR('G', 2, struct gpufs_alloc)
/* Seal the blob now. Writes after it: EPERM. A blob given device memory by
 * GPUFS_IOC_ALLOC must be sealed this way: released unsealed, it is discarded
 * (its producer died or gave up). Blobs written with write(2) are sealed by
 * their last close. */
#define GPUFS_IOC_SEAL _IO('G', 3)
/* As GPUFS_IOC_MAP; the same errors. No connection with that cookie (closed,
 * never made): the reply has no GPUFS_INFO_FD_SENT and carries a token as
 * GPUFS_IOC_MAP's does. The cookie of another uid's or process's
 * connection: EACCES, and the token is spent. */
#define GPUFS_IOC_MAP_PUSH _IOWR('G', 4, struct gpufs_map_push)
/* On a member opened for writing and filled with write(2): this writer will
 * seal it with GPUFS_IOC_SEAL. Released unsealed (the writer was killed or
 * gave up), it is then discarded, as a GPUFS_IOC_ALLOC'd blob is, instead of
 * sealed by the last close as a plain tool's member is; a daemon that stops
 * meanwhile discards it at its next start. So a member meant to appear
 * complete or not at all never shows half-written. GPUFS_IOC_ALLOC implies
 * it (and answers EEXIST after it). EBADF: not opened for writing. EPERM:
 * sealed. ENOTTY: a daemon older than this ioctl (the member is sealed at
 * its last close). */
#define GPUFS_IOC_EXPLICIT_SEAL _IO('G', 5)

/* ---- Objects written and mapped as a whole ---------------------------------
 * An object written as a whole (Python gpufs.save of a dict, `gpufs import`,
 * gpufs_object_create ... gpufs_object_commit) is one allocation per object, its members at the places
 * of the layout rule: in manifest order, the first at offset 0, each next one
 * at the first multiple of GPUFS_OBJECT_ALIGN at or after the end of the one
 * before (a member of 0 bytes takes one unit). docs/PROTOCOL.md walks both
 * directions. */
#define GPUFS_OBJECT_ALIGN 512u

/* GPUFS_IOC_ALLOC_OBJECT: on a member just created (O_CREAT|O_EXCL|O_RDWR;
 * by convention ".NAME.saving-PID" beside where the object goes) into which
 * the producer wrote the object's manifest (JSON, docs/PROTOCOL.md), the
 * daemon makes the object it describes, hidden as "<that member's name>.d"
 * until GPUFS_IOC_SEAL_OBJECT, every member an unsealed blob at its place.
 * On a GPU, `info` is the producer's writable mapping of the whole object
 * (offset 0, size `bytes`), its fd sent at once on the fd-socket connection
 * named by `cookie` (GPUFS_INFO_FD_SENT) or else redeemable with its token.
 * In host memory info.handle_type is 0: write the members' bytes with
 * pwrite(2) on this descriptor at their layout offsets. Released without
 * GPUFS_IOC_SEAL_OBJECT (its producer died or gave up), the object goes.
 * EINVAL: a bad manifest (the log says what). ENOSPC: it does not fit. */
struct gpufs_alloc_object {
  uint8_t cookie[GPUFS_TOKEN_BYTES]; /* in */
  uint64_t bytes;                    /* out: the end of the layout */
  uint64_t members;                  /* out */
  struct gpufs_ipc_info info;        /* out */
};

/* GPUFS_IOC_SEAL_OBJECT: on the same descriptor, seals every member (their
 * checksums taken on the GPU) and in one step puts the object at `name` in
 * the staging member's object, in place of what is there (an object and all
 * under it, or a member) when `flags` has GPUFS_SEAL_REPLACE (EEXIST
 * otherwise), and removes the staging member. Readers see the whole new
 * object or the old. Replacing needs what removing would: write and search
 * permission on the parent and every object that goes (EACCES), the sticky
 * rule (EPERM). */
#define GPUFS_SEAL_REPLACE 1u
struct gpufs_seal_object {
  char name[256]; /* in: NUL-terminated */
  uint32_t flags; /* in: GPUFS_SEAL_* */
  uint32_t reserved;
};

/* GPUFS_IOC_MAP_OBJECT: on an open object (a directory opened O_RDONLY),
 * every sealed GPU member under it that the caller may open (read
 * permission on the member, read and search on each object between), in one
 * request. Before the reply the daemon sends on the fd-socket connection
 * named by `cookie` (which must be the caller's: EACCES otherwise; ENOTCONN
 * when there is none) `messages` struct gpufs_fd_object messages: the first
 * carries a memfd holding the object's description (below), then one fd per
 * VMM allocation, in the description's order. The open object holds what it
 * mapped: keep it open while the memory is in use. Members the caller may
 * not open, or that are not sealed GPU blobs, are described as skipped. */
struct gpufs_map_object_req {
  uint8_t cookie[GPUFS_TOKEN_BYTES]; /* in */
  uint32_t members;                  /* out: mapped */
  uint32_t skipped;                  /* out: left out */
  uint32_t allocations;              /* out */
  uint32_t messages;                 /* out */
  uint64_t generation;               /* out */
};
#define GPUFS_FD_OBJECT_MAGIC 0x4a424f47u /* "GOBJ" */
#define GPUFS_FD_OBJECT_MAX_FDS 250u      /* per message (the kernel takes 253) */
struct gpufs_fd_object {
  uint32_t magic;             /* GPUFS_FD_OBJECT_MAGIC */
  uint32_t part;              /* 0 .. parts - 1 */
  uint32_t parts;
  uint32_t fds;               /* attached to this message */
  uint64_t description_bytes; /* of the memfd (part 0's first fd) */
};
/* The description: a header, the allocations, then the members (mapped
 * first, then skipped), then a string area that name/dtype/why offsets and
 * shapes (uint64_t each, 8-byte aligned) point into. */
#define GPUFS_OBJECT_DESC_MAGIC 0x43534447u /* "GDSC" */
#define GPUFS_OBJECT_NONE 0xffffffffu
struct gpufs_object_desc {
  uint32_t magic;   /* GPUFS_OBJECT_DESC_MAGIC */
  uint32_t version; /* GPUFS_UAPI_VERSION */
  uint32_t members; /* mapped */
  uint32_t skipped;
  uint32_t allocations;
  uint32_t reserved;
  uint64_t strings; /* offset of the string area */
};
struct gpufs_object_alloc {
  uint64_t alloc_size;     /* map it all */
  uint64_t memory;         /* the daemon's name for it */
  uint8_t device_uuid[16];
  uint32_t handle_type;    /* GPUFS_HANDLE_* */
  uint32_t flags;          /* GPUFS_INFO_PRIVATE_COPY */
  uint8_t handle[64];      /* legacy: the cudaIpcMemHandle_t */
};
struct gpufs_object_member {
  uint32_t name, name_len;   /* relative to the object ("sub/w") */
  uint32_t dtype, dtype_len; /* dtype_len 0: none */
  uint32_t shape, ndim;      /* ndim GPUFS_OBJECT_NONE: no shape */
  uint32_t alloc;            /* index into the allocations; NONE: skipped */
  int32_t error;             /* skipped: why, an errno */
  uint64_t offset;           /* of the member in its allocation */
  uint64_t size;
  uint64_t blob_id;
  uint32_t why, why_len;     /* skipped: why, in words */
};

/* GPUFS_IOC_VERIFY: the checksum of a sealed GPU member computed on the GPU
 * now, beside the one taken when it was sealed. */
struct gpufs_verify {
  uint64_t recorded;
  uint64_t computed;
  uint32_t checked; /* 0: nothing recorded (not a sealed GPU member) */
  uint32_t ok;      /* 1: they match */
};

#define GPUFS_IOC_ALLOC_OBJECT _IOWR('G', 6, struct gpufs_alloc_object)
#define GPUFS_IOC_SEAL_OBJECT _IOW('G', 7, struct gpufs_seal_object)
#define GPUFS_IOC_MAP_OBJECT _IOWR('G', 8, struct gpufs_map_object_req)
#define GPUFS_IOC_VERIFY _IOR('G', 9, struct gpufs_verify)

/* GPUFS_IOC_PUBLISH, on an open object (opendir) of a mount in cluster
 * mode: publishes the object's current sealed version to every node of the
 * cluster (its manifest in etcd, its bytes served from this node), or with
 * GPUFS_PUBLISH_REMOVE a "removed" version. The caller must own the object
 * or may write it (EACCES); EBUSY for a member still being written,
 * EOPNOTSUPP outside cluster mode, ETIMEDOUT/ECONNREFUSED... when etcd
 * cannot be reached within the mount's --cluster-timeout. */
#define GPUFS_PUBLISH_REMOVE 1u
struct gpufs_publish {
  uint32_t flags;   /* in: GPUFS_PUBLISH_* */
  uint32_t reserved;
  uint64_t version; /* out: the version published */
};
#define GPUFS_IOC_PUBLISH _IOWR('G', 10, struct gpufs_publish)

/* GPUFS_IOC_COPY_WAIT, on the member a map answered with
 * GPUFS_INFO_COPY_PENDING: returns once the private copy's bytes are all
 * there (at once when they are). EIO: the copy failed, or the worker that
 * made it was replaced (the bytes are not to be used: unmap, map again).
 * EISDIR on an object. */
#define GPUFS_IOC_COPY_WAIT _IO('G', 11)

#endif /* GPUFS_UAPI_H_ */
