/* The public headers are C: this file fails to build if they stop being
 * valid C, or if the layout C sees differs from the one C++ sees
 * (uapi_test.cc pins the same numbers). */
#include <stddef.h>

#include "gpufs/gpufs.h"
#include "gpufs/uapi.h"

_Static_assert(sizeof(struct gpufs_ipc_info) == 168, "gpufs_ipc_info size");
_Static_assert(offsetof(struct gpufs_ipc_info, handle) == 8, "handle offset");
_Static_assert(offsetof(struct gpufs_ipc_info, offset) == 72, "offset offset");
_Static_assert(offsetof(struct gpufs_ipc_info, device_uuid) == 88, "device_uuid offset");
_Static_assert(offsetof(struct gpufs_ipc_info, generation) == 112, "generation offset");
_Static_assert(sizeof(struct gpufs_alloc) == 176, "gpufs_alloc size");
_Static_assert(offsetof(struct gpufs_alloc, info) == 8, "gpufs_alloc info offset");
_Static_assert(GPUFS_IOC_MAP == 0x80A84701u, "GPUFS_IOC_MAP");
_Static_assert(GPUFS_IOC_ALLOC == 0xC0B04702u, "GPUFS_IOC_ALLOC");
_Static_assert(GPUFS_IOC_SEAL == 0x00004703u, "GPUFS_IOC_SEAL");

/* Referenced from uapi_test.cc so the object is linked in. */
int gpufs_headers_c_check(void) { return (int)sizeof(struct gpufs_buffer); }
