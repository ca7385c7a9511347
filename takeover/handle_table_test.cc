// The shared handle table on a real memfd: a worker's records survive it (a
// later attach adopts them), a SIGKILL at any instant leaves every slot whole
// or empty, and the registry hands table handles (and the live sizes of the
// blobs they hold, only those, the table's before the messages') to the next
// worker.
#include "takeover/handle_table.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>

#include "takeover/registry.h"
#include "takeover/worker_link.h"

namespace gpufs::takeover {
namespace {

UniqueFd Dup(int fd) { return UniqueFd(::dup(fd)); }

// A record whose every field follows from fh: a torn one shows.
HandleRecord RecordFor(uint64_t fh) {
  return {.fh = fh,
          .entry = fh * 3,
          .blob = fh * 5,
          .unique = fh * 7,
          .flags = kHandleWritable,
          .pid = static_cast<uint32_t>(fh & 0xffff)};
}

// The registry now serves worker `generation` (its handover, discarded).
void StartWorker(Registry& reg, uint32_t generation) {
  auto ch = MakeChannelPair();
  ASSERT_TRUE(ch.ok());
  ASSERT_TRUE(reg.SendHandover(ch->first.get(), generation, 1).ok());
  ASSERT_TRUE(ReceiveHandover(ch->second.get()).ok());
}

// Applies the next message on `from` (the supervisor's end) to `reg`; it
// must be of type `want`.
void ApplyNext(int from, Registry& reg, MsgType want) {
  auto m = Receive(from);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->type, want);
  Status applied = reg.Apply(std::move(*m));
  ASSERT_TRUE(applied.ok()) << applied.ToString();
}

// Sends a message on `to` (a worker's end) and applies it from `from`.
void SendApply(int to, int from, Registry& reg, MsgType type,
               std::span<const std::byte> payload) {
  ASSERT_TRUE(Send(to, type, payload).ok());
  ApplyNext(from, reg, type);
}

// A supervisor's table of `slots` slots and its registry, worker 1 started.
struct Supervisor {
  explicit Supervisor(size_t slots) {
    auto made = HandleTable::Create(slots);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    if (!made.ok()) return;
    table = std::make_unique<HandleTable>(std::move(*made));
    reg.set_table(table.get());
    StartWorker(reg, 1);
  }
  std::unique_ptr<HandleTable> table;  // null when Create failed
  Registry reg;
};

// What `reg` hands over to worker 2.
Handover HandoverToNext(Registry& reg) {
  auto next = MakeChannelPair();
  EXPECT_TRUE(next.ok());
  if (!next.ok()) return {};
  EXPECT_TRUE(reg.SendHandover(next->first.get(), 2, 1).ok());
  auto h = ReceiveHandover(next->second.get());
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  return h.ok() ? std::move(*h) : Handover{};
}

std::map<uint64_t, HandleRecord> ByFh(const std::vector<HandleRecord>& records) {
  std::map<uint64_t, HandleRecord> out;
  for (const HandleRecord& r : records) EXPECT_TRUE(out.emplace(r.fh, r).second) << r.fh;
  return out;
}

TEST(HandleTableTest, PutFlagsRemoveAndFull) {
  auto sup = HandleTable::Create(3);
  ASSERT_TRUE(sup.ok()) << sup.status().ToString();
  auto worker = HandleTable::Attach(Dup(sup->fd()), 1);
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  EXPECT_EQ(sup->writer_generation(), 1u);
  EXPECT_TRUE(worker->Put(RecordFor(10)));
  EXPECT_TRUE(worker->Put(RecordFor(11)));
  EXPECT_TRUE(worker->Put(RecordFor(12)));
  EXPECT_FALSE(worker->Put(RecordFor(13)));  // full: the caller sends a message
  EXPECT_TRUE(worker->AddFlags(11, kHandleMapped));
  EXPECT_FALSE(worker->AddFlags(13, kHandleMapped));
  EXPECT_TRUE(worker->Remove(10));
  EXPECT_FALSE(worker->Remove(10));
  EXPECT_TRUE(worker->Put(RecordFor(13)));  // the freed slot
  HandleRecord again = RecordFor(12);
  again.unique = 5;
  EXPECT_TRUE(worker->Put(again));  // same fh: replaced in place, not a second record

  bool stable = false;
  auto seen = ByFh(sup->Snapshot(&stable));
  EXPECT_TRUE(stable);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[11].flags, kHandleWritable | kHandleMapped);
  EXPECT_EQ(seen[12].unique, 5u);
  EXPECT_EQ(seen[13].blob, 65u);
  EXPECT_FALSE(seen.contains(10));
}

TEST(HandleTableTest, NextWorkerAdoptsTheRecords) {
  auto sup = HandleTable::Create(1000);
  ASSERT_TRUE(sup.ok());
  {
    auto first = HandleTable::Attach(Dup(sup->fd()), 1);
    ASSERT_TRUE(first.ok());
    for (uint64_t fh = 1; fh <= 5; ++fh) ASSERT_TRUE(first->Put(RecordFor(fh)));
    ASSERT_TRUE(first->Remove(2));
    ASSERT_TRUE(first->SetSize(5 * 5, 1234));  // fh 5 holds blob 25
    EXPECT_FALSE(first->SetSize(2 * 5, 1));    // fh 2's blob: no table handle holds it
  }  // the worker is gone; its records stay
  auto second = HandleTable::Attach(Dup(sup->fd()), 2);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(second->Remove(4));  // an inherited handle closes in the table
  EXPECT_FALSE(second->Remove(2));
  EXPECT_TRUE(second->AddFlags(5, kHandleMapped));
  ASSERT_TRUE(second->Put(RecordFor(100)));
  ASSERT_TRUE(second->SetSize(25, 2000));  // the adopted size record, updated
  bool stable = false;
  std::map<uint64_t, uint64_t> sizes;
  auto seen = ByFh(sup->Snapshot(&stable, &sizes));
  EXPECT_TRUE(stable);
  ASSERT_EQ(seen.size(), 4u);  // 1, 3, 5, 100
  EXPECT_EQ(seen[5].flags, kHandleWritable | kHandleMapped);
  EXPECT_EQ(seen[100].entry, 300u);
  EXPECT_EQ(sizes, (std::map<uint64_t, uint64_t>{{25, 2000}}));
  ASSERT_TRUE(second->Remove(5));  // the last holder of blob 25: its size goes too
  sizes.clear();
  sup->Snapshot(&stable, &sizes);
  EXPECT_TRUE(sizes.empty());
}

TEST(HandleTableTest, NotATable) {
  UniqueFd fd(::memfd_create("junk", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(fd.get(), 4096), 0);
  auto attached = HandleTable::Attach(std::move(fd), 1);
  ASSERT_FALSE(attached.ok());
  EXPECT_EQ(attached.status().code(), EPROTO);
}

// A child process churns the table (puts, flag updates, sizes, removes,
// reuse of slots) and is SIGKILLed at an arbitrary instant: every record the
// table then holds is whole, and the next attach keeps only the sizes of
// blobs a handle holds.
TEST(HandleTableTest, SigkillLeavesEverySlotWholeOrEmpty) {
  auto sup = HandleTable::Create(256);
  ASSERT_TRUE(sup.ok());
  // Operations the child has done, shared with this process.
  auto* done = static_cast<std::atomic<uint64_t>*>(::mmap(
      nullptr, sizeof(std::atomic<uint64_t>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
      -1, 0));
  ASSERT_NE(done, MAP_FAILED);
  std::mt19937_64 rng(12);
  for (int round = 0; round < 20; ++round) {
    done->store(0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto table = HandleTable::Attach(Dup(sup->fd()), static_cast<uint32_t>(round) + 1);
      if (!table.ok()) ::_exit(2);
      std::mt19937_64 child_rng(static_cast<uint64_t>(round) + 1);
      for (uint64_t i = 0;; ++i) {
        uint64_t fh = 1 + child_rng() % 200;
        switch (child_rng() % 4) {
          case 0: table->Put(RecordFor(fh)); break;
          case 1: table->AddFlags(fh, kHandleMapped); break;
          case 2: table->SetSize(fh * 5, fh * 11); break;
          default: table->Remove(fh); break;
        }
        done->store(i + 1, std::memory_order_relaxed);
      }
    }
    uint64_t kill_after = 1000 + rng() % 50000;
    while (done->load(std::memory_order_relaxed) < kill_after) {
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, WNOHANG), 0) << "the churning child ended early";
    }
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status));

    bool stable = false;
    std::map<uint64_t, uint64_t> sizes;
    std::vector<HandleRecord> records = sup->Snapshot(&stable, &sizes);
    EXPECT_TRUE(stable);
    std::set<uint64_t> held;
    for (const HandleRecord& r : records) {
      HandleRecord want = RecordFor(r.fh);
      EXPECT_EQ(r.entry, want.entry);
      EXPECT_EQ(r.blob, want.blob);
      EXPECT_EQ(r.unique, want.unique);
      EXPECT_EQ(r.pid, want.pid);
      EXPECT_EQ(r.flags & ~kHandleMapped, kHandleWritable);
      held.insert(r.blob);
    }
    ByFh(records);  // no fh twice
    for (const auto& [blob, size] : sizes) EXPECT_EQ(size, blob / 5 * 11) << blob;
    {
      // A killed close may leave the size of a blob no handle holds; the
      // next worker drops it when it attaches.
      auto next = HandleTable::Attach(Dup(sup->fd()), 1000);
      ASSERT_TRUE(next.ok());
      sizes.clear();
      sup->Snapshot(&stable, &sizes);
      for (const auto& [blob, size] : sizes) EXPECT_TRUE(held.contains(blob)) << blob;
    }
  }
  ::munmap(done, sizeof(std::atomic<uint64_t>));
}

TEST(HandleTableTest, RegistryHandsOverTableHandlesAndTheirSizes) {
  Supervisor rig(16);
  ASSERT_TRUE(rig.table);
  HandleTable* sup = rig.table.get();
  Registry& reg = rig.reg;
  auto worker = HandleTable::Attach(Dup(sup->fd()), 1);
  ASSERT_TRUE(worker.ok());
  ASSERT_TRUE(worker->Put(RecordFor(1)));  // blob 5
  ASSERT_TRUE(worker->Put(RecordFor(2)));  // blob 10
  ASSERT_TRUE(worker->Put(RecordFor(3)));  // blob 15
  ASSERT_TRUE(worker->SetSize(15, 1500));
  auto ch = MakeChannelPair();
  ASSERT_TRUE(ch.ok());
  // By message: sizes reported while no table handle held the blob.
  for (BlobSize bs : {BlobSize{5, 500}, BlobSize{10, 1000}, BlobSize{15, 3}, BlobSize{99, 9}}) {
    SendApply(ch->second.get(), ch->first.get(), reg, MsgType::kBlobSize, AsBytes(bs));
  }
  ASSERT_TRUE(worker->Remove(2));  // blob 10 no longer held: its size is not handed over
  EXPECT_EQ(reg.handles(), 2u);

  Handover h = HandoverToNext(reg);
  auto handed = ByFh(h.handles);
  ASSERT_EQ(handed.size(), 2u);
  EXPECT_EQ(handed[1].unique, 7u);
  EXPECT_EQ(h.sizes, (std::map<uint64_t, uint64_t>{{5, 500}, {15, 1500}}));
}

// An older gpufsd after a newer one: handed the table's records, it maps
// and closes them by message; the supervisor applies those to the table.
TEST(HandleTableTest, MessagesOfAnOlderWorkerReachTheTable) {
  Supervisor rig(8);
  ASSERT_TRUE(rig.table);
  HandleTable* sup = rig.table.get();
  Registry& reg = rig.reg;
  {
    auto newer = HandleTable::Attach(Dup(sup->fd()), 1);
    ASSERT_TRUE(newer.ok());
    ASSERT_TRUE(newer->Put(RecordFor(1)));
    ASSERT_TRUE(newer->Put(RecordFor(2)));
    ASSERT_TRUE(newer->SetSize(10, 100));
  }
  StartWorker(reg, 2);  // the older one: it never attaches
  auto ch = MakeChannelPair();
  ASSERT_TRUE(ch.ok());
  auto send_apply = [&](MsgType type, std::span<const std::byte> payload) {
    SendApply(ch->second.get(), ch->first.get(), reg, type, payload);
  };
  HandleRecord mapped{.fh = 2, .flags = kHandleMapped};
  send_apply(MsgType::kHandleUpdate, AsBytes(mapped));
  uint64_t closed = 1;
  send_apply(MsgType::kHandleClose, AsBytes(closed));
  BlobSize grown{10, 200};  // its write went on after the takeover
  send_apply(MsgType::kBlobSize, AsBytes(grown));
  bool stable = false;
  std::map<uint64_t, uint64_t> sizes;
  auto seen = ByFh(sup->Snapshot(&stable, &sizes));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[2].flags, kHandleWritable | kHandleMapped);
  EXPECT_EQ(sizes[10], 200u);
}

// A worker whose table is full reports the handles that do not fit by
// message, as an older worker would: the next worker gets both kinds.
TEST(HandleTableTest, WorkerLinkFallsBackToMessagesWhenTheTableIsFull) {
  Supervisor rig(1);
  ASSERT_TRUE(rig.table);
  HandleTable* sup = rig.table.get();
  Registry& reg = rig.reg;
  auto ch = MakeChannelPair();
  ASSERT_TRUE(ch.ok());
  auto worker_table = HandleTable::Attach(Dup(sup->fd()), 1);
  ASSERT_TRUE(worker_table.ok());
  UniqueFd supervisor_end = std::move(ch->first);
  WorkerLink link(std::move(ch->second), -1, Handover{},
                  std::make_unique<HandleTable>(std::move(*worker_table)));
  auto apply_next = [&](MsgType want) { ApplyNext(supervisor_end.get(), reg, want); };
  link.HandleOpened(RecordFor(1));  // the table's one slot
  link.HandleOpened(RecordFor(2));  // a message
  apply_next(MsgType::kHandleOpen);
  link.HandleMapped(1);
  link.HandleMapped(2);
  apply_next(MsgType::kHandleUpdate);
  link.HandleOpened(RecordFor(3));  // a message
  apply_next(MsgType::kHandleOpen);
  link.HandleClosed(3);
  apply_next(MsgType::kHandleClose);
  // Sizes: blob 5 is held by table handle 1, but no slot is left for its
  // size; blob 10 only by message handle 2. Both go by message.
  link.BlobSizeChanged(5, 123);
  apply_next(MsgType::kBlobSize);
  link.BlobSizeChanged(10, 456);
  apply_next(MsgType::kBlobSize);
  bool stable = false;
  EXPECT_EQ(sup->Snapshot(&stable).size(), 1u);  // nothing else went into the table

  Handover h = HandoverToNext(reg);
  auto handed = ByFh(h.handles);
  ASSERT_EQ(handed.size(), 2u);
  EXPECT_EQ(handed[1].flags, kHandleWritable | kHandleMapped);
  EXPECT_EQ(handed[2].flags, kHandleWritable | kHandleMapped);
  EXPECT_EQ(handed[2].blob, 10u);
  EXPECT_EQ(h.sizes, (std::map<uint64_t, uint64_t>{{5, 123}, {10, 456}}));
}

}  // namespace
}  // namespace gpufs::takeover
