"""The ioctls of include/gpufs/uapi.h that the package issues itself (the
rest go through libgpufs). proto/check_python_proto.py checks these numbers
against the C header."""

GPUFS_IOC_SEAL = 0x4703           # _IO('G', 3): seal the member now
GPUFS_IOC_EXPLICIT_SEAL = 0x4705  # _IO('G', 5): this writer seals; unsealed at release = discarded
GPUFS_IOC_PUBLISH = 0xC010470A   # _IOWR('G', 10, struct gpufs_publish): publish an open object
GPUFS_PUBLISH_REMOVE = 1
