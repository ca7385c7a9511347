// Pins the binary interface of gpufs/uapi.h: struct layouts and ioctl
// numbers are shared with daemons and clients built at other times (and with
// Python's ctypes mirror), so any drift must fail here first.
#include "gpufs/uapi.h"

#include "gpufs/gpufs.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>

extern "C" int gpufs_headers_c_check(void);  // headers_c_test.c

namespace {

// Compile-time too, so a drift fails the build before any test runs.
static_assert(sizeof(struct gpufs_ipc_info) == 168);
static_assert(alignof(struct gpufs_ipc_info) == 8);
static_assert(sizeof(gpufs_alloc) == 176);
static_assert(GPUFS_IOC_MAP == 0x80A84701u);
static_assert(GPUFS_IOC_ALLOC == 0xC0B04702u);
static_assert(GPUFS_IOC_SEAL == 0x00004703u);
static_assert(sizeof(struct gpufs_map_push) == 200);
static_assert(offsetof(struct gpufs_map_push, info) == 32);
static_assert(GPUFS_IOC_MAP_PUSH == 0xC0C84704u);
static_assert(sizeof(struct gpufs_fd_hello) == 40);

TEST(Uapi, IpcInfoLayout) {
  EXPECT_EQ(sizeof(struct gpufs_ipc_info), 168u);
  EXPECT_EQ(offsetof(struct gpufs_ipc_info, handle_type), 120u);
  EXPECT_EQ(offsetof(struct gpufs_ipc_info, flags), 124u);
  EXPECT_EQ(offsetof(struct gpufs_ipc_info, alloc_size), 128u);
  EXPECT_EQ(offsetof(struct gpufs_ipc_info, token), 136u);
  EXPECT_EQ(sizeof(struct gpufs_fd_request), 40u);
  EXPECT_EQ(sizeof(struct gpufs_fd_reply), 136u);
  EXPECT_EQ(alignof(struct gpufs_ipc_info), 8u);
  EXPECT_EQ(offsetof(struct gpufs_ipc_info, magic), 0u);
  EXPECT_EQ(offsetof(struct gpufs_ipc_info, version), 4u);
  EXPECT_EQ(offsetof(struct gpufs_ipc_info, handle), 8u);
  EXPECT_EQ(sizeof(gpufs_ipc_info::handle), 64u);
  EXPECT_EQ(offsetof(struct gpufs_ipc_info, offset), 72u);
  EXPECT_EQ(offsetof(struct gpufs_ipc_info, size), 80u);
  EXPECT_EQ(offsetof(struct gpufs_ipc_info, device_uuid), 88u);
  EXPECT_EQ(sizeof(gpufs_ipc_info::device_uuid), 16u);
  EXPECT_EQ(offsetof(struct gpufs_ipc_info, blob_id), 104u);
  EXPECT_EQ(offsetof(struct gpufs_ipc_info, generation), 112u);
}

TEST(Uapi, HeadersAreC) {
  // struct gpufs_buffer as a C compiler lays it out.
  EXPECT_EQ(gpufs_headers_c_check(), 56);
}

// struct gpufs_buffer is libgpufs's ABI (Python mirrors it with ctypes).
TEST(Uapi, BufferLayout) {
  EXPECT_EQ(sizeof(gpufs_buffer), 56u);
  EXPECT_EQ(offsetof(gpufs_buffer, ptr), 0u);
  EXPECT_EQ(offsetof(gpufs_buffer, size), 8u);
  EXPECT_EQ(offsetof(gpufs_buffer, device), 16u);
  EXPECT_EQ(offsetof(gpufs_buffer, fd), 20u);
  EXPECT_EQ(offsetof(gpufs_buffer, flags), 24u);
  EXPECT_EQ(offsetof(gpufs_buffer, blob_id), 32u);
  EXPECT_EQ(offsetof(gpufs_buffer, generation), 40u);
  EXPECT_EQ(offsetof(gpufs_buffer, internal), 48u);
  EXPECT_EQ(GPUFS_BUFFER_WRITABLE, 1u);
}

TEST(Uapi, AllocLayout) {
  EXPECT_EQ(sizeof(gpufs_alloc), 176u);
  EXPECT_EQ(alignof(gpufs_alloc), 8u);
  EXPECT_EQ(offsetof(gpufs_alloc, size), 0u);
  EXPECT_EQ(offsetof(gpufs_alloc, info), 8u);
}

TEST(Uapi, MagicIsGpufInMemoryOrder) {
  uint32_t magic = GPUFS_MAGIC;
  EXPECT_EQ(std::memcmp(&magic, "GPUF", 4), 0);
  EXPECT_EQ(GPUFS_UAPI_VERSION, 2u);
  EXPECT_STREQ(GPUFS_XATTR_IPC_HANDLE, "user.gpufs.ipc_handle");
}

TEST(Uapi, MapIoctlNumber) {
  EXPECT_EQ(_IOC_DIR(GPUFS_IOC_MAP), static_cast<unsigned>(_IOC_READ));
  EXPECT_EQ(_IOC_TYPE(GPUFS_IOC_MAP), static_cast<unsigned>('G'));
  EXPECT_EQ(_IOC_NR(GPUFS_IOC_MAP), 1u);
  EXPECT_EQ(_IOC_SIZE(GPUFS_IOC_MAP), sizeof(struct gpufs_ipc_info));
  EXPECT_EQ(static_cast<unsigned long>(GPUFS_IOC_MAP), 0x80A84701ul);
}

TEST(Uapi, AllocIoctlNumber) {
  EXPECT_EQ(_IOC_DIR(GPUFS_IOC_ALLOC), static_cast<unsigned>(_IOC_READ | _IOC_WRITE));
  EXPECT_EQ(_IOC_TYPE(GPUFS_IOC_ALLOC), static_cast<unsigned>('G'));
  EXPECT_EQ(_IOC_NR(GPUFS_IOC_ALLOC), 2u);
  EXPECT_EQ(_IOC_SIZE(GPUFS_IOC_ALLOC), sizeof(gpufs_alloc));
  EXPECT_EQ(static_cast<unsigned long>(GPUFS_IOC_ALLOC), 0xC0B04702ul);
}

TEST(Uapi, SealIoctlNumber) {
  EXPECT_EQ(_IOC_DIR(GPUFS_IOC_SEAL), static_cast<unsigned>(_IOC_NONE));
  EXPECT_EQ(_IOC_TYPE(GPUFS_IOC_SEAL), static_cast<unsigned>('G'));
  EXPECT_EQ(_IOC_NR(GPUFS_IOC_SEAL), 3u);
  EXPECT_EQ(_IOC_SIZE(GPUFS_IOC_SEAL), 0u);
  EXPECT_EQ(static_cast<unsigned long>(GPUFS_IOC_SEAL), 0x00004703ul);
}

}  // namespace
