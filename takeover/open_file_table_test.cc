// The open file table on a real memfd: a worker's records survive it (a
// later attach adopts them), a SIGKILL at any instant leaves every slot whole
// or empty, a full table keeps room for the sizes of held blobs and refuses
// opens, and the registry hands the table's handles (and the live sizes of
// the blobs they hold, only those) to the next worker.
#include "takeover/open_file_table.h"

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

// A supervisor's table of `slots` slots and its registry, worker 1 started.
struct Supervisor {
  explicit Supervisor(uint32_t slots) : table(Make(slots)), reg(table) { StartWorker(reg, 1); }
  static OpenFileTable Make(uint32_t slots) {
    auto made = OpenFileTable::Create(slots);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    return std::move(*made);
  }
  OpenFileTable table;
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

TEST(OpenFileTableTest, PutFlagsRemoveAndFull) {
  auto sup = OpenFileTable::Create(5);
  ASSERT_TRUE(sup.ok()) << sup.status().ToString();
  auto worker = OpenFileTable::Attach(Dup(sup->fd()));
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  // Each handle of a blob not yet held takes its slot and keeps one for the
  // blob's size: 5 slots hold two such handles and one more of a held blob.
  EXPECT_TRUE(worker->Put(RecordFor(10)));  // blob 50
  EXPECT_TRUE(worker->Put(RecordFor(11)));  // blob 55
  EXPECT_FALSE(worker->Put(RecordFor(12)));  // blob 60: no room for it and its size
  HandleRecord reader = RecordFor(13);
  reader.blob = 50;  // a second handle of blob 50
  EXPECT_TRUE(worker->Put(reader));
  EXPECT_FALSE(worker->Put(RecordFor(14)));
  // Full, yet the sizes of the held blobs fit.
  EXPECT_TRUE(worker->SetSize(50, 500));
  EXPECT_TRUE(worker->SetSize(55, 550));
  EXPECT_FALSE(worker->SetSize(60, 1));  // no handle holds it
  EXPECT_TRUE(worker->AddFlags(11, kHandleMapped));
  EXPECT_FALSE(worker->AddFlags(12, kHandleMapped));
  EXPECT_TRUE(worker->Remove(10));
  EXPECT_FALSE(worker->Remove(10));
  HandleRecord again = RecordFor(11);
  again.unique = 5;
  EXPECT_TRUE(worker->Put(again));  // same fh: replaced in place, not a second record

  bool stable = false;
  std::map<uint64_t, uint64_t> sizes;
  auto seen = ByFh(sup->Snapshot(&stable, &sizes));
  EXPECT_TRUE(stable);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[11].unique, 5u);
  EXPECT_EQ(seen[13].blob, 50u);
  EXPECT_FALSE(seen.contains(10));
  EXPECT_EQ(sizes, (std::map<uint64_t, uint64_t>{{50, 500}, {55, 550}}));
  ASSERT_TRUE(worker->Remove(13));  // blob 50's last handle: its size goes too
  EXPECT_TRUE(worker->Put(RecordFor(12)));  // room again
}

TEST(OpenFileTableTest, NextWorkerAdoptsTheRecords) {
  auto sup = OpenFileTable::Create(1000);
  ASSERT_TRUE(sup.ok());
  {
    auto first = OpenFileTable::Attach(Dup(sup->fd()));
    ASSERT_TRUE(first.ok());
    for (uint64_t fh = 1; fh <= 5; ++fh) ASSERT_TRUE(first->Put(RecordFor(fh)));
    ASSERT_TRUE(first->Remove(2));
    ASSERT_TRUE(first->SetSize(5 * 5, 1234));  // fh 5 holds blob 25
    EXPECT_FALSE(first->SetSize(2 * 5, 1));    // fh 2's blob: no table handle holds it
  }  // the worker is gone; its records stay
  auto second = OpenFileTable::Attach(Dup(sup->fd()));
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

TEST(OpenFileTableTest, NotATable) {
  UniqueFd fd(::memfd_create("junk", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(fd.get(), 4096), 0);
  auto attached = OpenFileTable::Attach(std::move(fd));
  ASSERT_FALSE(attached.ok());
  EXPECT_EQ(attached.status().code(), EPROTO);
}

// A child process churns the table (puts, flag updates, sizes, removes,
// reuse of slots) and is SIGKILLed at an arbitrary instant: every record the
// table then holds is whole, and the next attach keeps only the sizes of
// blobs a handle holds.
TEST(OpenFileTableTest, SigkillLeavesEverySlotWholeOrEmpty) {
  auto sup = OpenFileTable::Create(256);
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
      auto table = OpenFileTable::Attach(Dup(sup->fd()));
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
      auto next = OpenFileTable::Attach(Dup(sup->fd()));
      ASSERT_TRUE(next.ok());
      sizes.clear();
      sup->Snapshot(&stable, &sizes);
      for (const auto& [blob, size] : sizes) EXPECT_TRUE(held.contains(blob)) << blob;
    }
  }
  ::munmap(done, sizeof(std::atomic<uint64_t>));
}

TEST(OpenFileTableTest, RegistryHandsOverTheHandlesAndTheirSizes) {
  Supervisor rig(16);
  Registry& reg = rig.reg;
  auto worker = OpenFileTable::Attach(Dup(rig.table.fd()));
  ASSERT_TRUE(worker.ok());
  ASSERT_TRUE(worker->Put(RecordFor(1)));  // blob 5
  ASSERT_TRUE(worker->Put(RecordFor(2)));  // blob 10
  ASSERT_TRUE(worker->Put(RecordFor(3)));  // blob 15
  ASSERT_TRUE(worker->SetSize(5, 500));
  ASSERT_TRUE(worker->SetSize(10, 1000));
  ASSERT_TRUE(worker->SetSize(15, 1500));
  ASSERT_TRUE(worker->Remove(2));  // blob 10 no longer held: its size is not handed over
  EXPECT_EQ(reg.handles(), 2u);

  Handover h = HandoverToNext(reg);
  auto handed = ByFh(h.handles);
  ASSERT_EQ(handed.size(), 2u);
  EXPECT_EQ(handed[1].unique, 7u);
  EXPECT_EQ(h.sizes, (std::map<uint64_t, uint64_t>{{5, 500}, {15, 1500}}));
}

// The table is the one way handles travel: when it is full the worker
// refuses the open (ENFILE) and the table keeps what it had.
TEST(OpenFileTableTest, WorkerLinkRefusesAnOpenWhenTheTableIsFull) {
  Supervisor rig(2);
  auto ch = MakeChannelPair();
  ASSERT_TRUE(ch.ok());
  auto worker_table = OpenFileTable::Attach(Dup(rig.table.fd()));
  ASSERT_TRUE(worker_table.ok());
  auto journal = ReplyJournal::Create(4);
  ASSERT_TRUE(journal.ok());
  WorkerLink link(std::move(ch->second), -1, Handover{}, std::move(*worker_table),
                  std::move(*journal));
  ASSERT_TRUE(link.HandleOpened(RecordFor(1)).ok());  // a slot, and one kept for blob 5's size
  Status refused = link.HandleOpened(RecordFor(2));
  EXPECT_EQ(refused.code(), ENFILE) << refused.ToString();
  link.HandleMapped(1);
  link.BlobSizeChanged(5, 123);  // the kept slot
  Handover h = HandoverToNext(rig.reg);
  auto handed = ByFh(h.handles);
  ASSERT_EQ(handed.size(), 1u);
  EXPECT_EQ(handed[1].flags, kHandleWritable | kHandleMapped);
  EXPECT_EQ(h.sizes, (std::map<uint64_t, uint64_t>{{5, 123}}));
}

}  // namespace
}  // namespace gpufs::takeover
