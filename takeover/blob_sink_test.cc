// The worker's BlobFdSink over a real channel into a real Registry, with
// memfds standing in for GPU VMM exports (the GPU side: store/vmm_takeover_test.cc
// and tests/takeover/gpu_takeover_test.py).
#include "takeover/blob_sink.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "takeover/registry.h"
#include "takeover/test_memfd.h"

namespace gpufs::takeover {
namespace {

class BlobSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pair = MakeChannelPair();
    ASSERT_TRUE(pair.ok());
    supervisor_ = std::move(pair->first);
    auto table = OpenFileTable::Attach(UniqueFd(::dup(table_.fd())));
    auto journal = ReplyJournal::Create(4);
    ASSERT_TRUE(table.ok() && journal.ok());
    link_ = std::make_unique<WorkerLink>(std::move(pair->second), -1, Handover{},
                                         std::move(*table), std::move(*journal));
    sink_ = std::make_unique<SupervisorBlobSink>(*link_);
  }
  // Applies every message the worker sent so far (it sends synchronously).
  void Drain() {
    for (;;) {
      pollfd p{supervisor_.get(), POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) return;
      auto m = Receive(supervisor_.get());
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      Status applied = registry_.Apply(std::move(*m));
      ASSERT_TRUE(applied.ok()) << applied.ToString();
    }
  }
  UniqueFd supervisor_;
  std::unique_ptr<WorkerLink> link_;
  std::unique_ptr<SupervisorBlobSink> sink_;
  static OpenFileTable MakeTable() {
    auto made = OpenFileTable::Create(16);
    EXPECT_TRUE(made.ok());
    return std::move(*made);
  }
  OpenFileTable table_ = MakeTable();
  Registry registry_{table_};
};

TEST_F(BlobSinkTest, TheSupervisorKeepsEachBlobsCurrentMemoryWithItsSize) {
  UniqueFd first = MemfdWith("first"), grown = MemfdWith("grown");
  sink_->BlobAdded(TierId::Gpu(0), 7, first.get(), {2 << 20, 0, 2 << 20, 1});
  sink_->BlobAdded(TierId::Gpu(0), 7, grown.get(), {4 << 20, 0, 4 << 20, 2});  // a Resize moved it
  first.reset();
  grown.reset();  // the worker's own copies go with the worker
  Drain();
  ASSERT_EQ(registry_.blobs(), 1u);
  EXPECT_EQ(ReadAll(registry_.blob_fd(7)), "grown");
  EXPECT_EQ(registry_.blob_bytes(7), 4u << 20);
  EXPECT_EQ(registry_.blob_record(7).memory, 2u);
  sink_->BlobFreed(TierId::Gpu(0), 7);
  Drain();
  EXPECT_EQ(registry_.blobs(), 0u);
}

TEST_F(BlobSinkTest, AMoveToAnotherGpuKeepsTheTargetsMemory) {
  UniqueFd on0 = MemfdWith("on gpu 0"), on1 = MemfdWith("on gpu 1");
  sink_->BlobAdded(TierId::Gpu(0), 9, on0.get(), {2 << 20, 0, 2 << 20, 3});
  sink_->BlobAdded(TierId::Gpu(1), 9, on1.get(), {2 << 20, 0, 2 << 20, 4});  // the target first
  sink_->BlobFreed(TierId::Gpu(0), 9);  // then the source lets go
  Drain();
  ASSERT_EQ(registry_.blobs(), 1u);
  EXPECT_EQ(ReadAll(registry_.blob_fd(9)), "on gpu 1");
  sink_->BlobFreed(TierId::Gpu(1), 9);
  Drain();
  EXPECT_EQ(registry_.blobs(), 0u);
}

TEST_F(BlobSinkTest, AFreeOfABlobThisWorkerNeverAddedIsForwarded) {
  // A blob the last worker added and this one re-imported at its start.
  UniqueFd kept = MemfdWith("kept");
  BlobFd add{11, 2 << 20, 0, 2 << 20, 5};
  Message m{MsgType::kBlobAdd, std::string(reinterpret_cast<char*>(&add), sizeof add), {}};
  m.fds.push_back(std::move(kept));
  ASSERT_TRUE(registry_.Apply(std::move(m)).ok());
  ASSERT_EQ(registry_.blobs(), 1u);
  sink_->BlobFreed(TierId::Gpu(0), 11);
  Drain();
  EXPECT_EQ(registry_.blobs(), 0u);
}

}  // namespace
}  // namespace gpufs::takeover
