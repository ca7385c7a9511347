// The reply journal on a real memfd: what a worker began and answered is
// what the next worker finds, by request id; records stay until settled (a
// worker that dies while it replays leaves them to the next); a SIGKILL at
// any instant leaves every record empty, begun, or answered with its whole
// reply.
#include "takeover/reply_journal.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <string>

namespace gpufs::takeover {
namespace {

UniqueFd Dup(int fd) { return UniqueFd(::dup(fd)); }

// A reply whose every byte follows from the request id: a torn one shows.
std::string ReplyFor(uint64_t unique) {
  std::string reply(16 + unique % 300, '\0');
  for (size_t i = 0; i < reply.size(); ++i) reply[i] = static_cast<char>(unique * 31 + i);
  return reply;
}

bool Answer(ReplyJournal& journal, int slot, const std::string& reply) {
  // As libfuse writes it: a header and a body.
  iovec iov[2] = {{const_cast<char*>(reply.data()), 16},
                  {const_cast<char*>(reply.data()) + 16, reply.size() - 16}};
  return journal.Answer(slot, iov);
}

TEST(ReplyJournalTest, TheNextWorkerFindsWhatWasBegunAndAnsweredById) {
  auto sup = ReplyJournal::Create(8);
  ASSERT_TRUE(sup.ok()) << sup.status().ToString();
  {
    auto worker = ReplyJournal::Attach(Dup(sup->fd()));
    ASSERT_TRUE(worker.ok()) << worker.status().ToString();
    EXPECT_EQ(worker->inherited(), 0u);
    int a = worker->Claim(), b = worker->Claim(), c = worker->Claim(), d = worker->Claim();
    ASSERT_GE(a, 0);
    ASSERT_NE(a, b);
    worker->Begin(a, 100, 9);
    ASSERT_TRUE(Answer(*worker, a, ReplyFor(100)));
    worker->Begin(a, 102, 9);  // the thread's next request replaces its last
    ASSERT_TRUE(Answer(*worker, a, ReplyFor(102)));
    worker->Begin(b, 101, 35);  // begun, killed before its reply
    worker->Begin(c, 103, 16);
    std::string huge(ReplyJournal::kMaxReply + 1, 'x');
    EXPECT_FALSE(Answer(*worker, c, huge));  // too large: stays begun
    worker->Begin(d, 104, 9);
    ASSERT_TRUE(Answer(*worker, d, ReplyFor(104)));
    worker->End(d);  // written: the kernel will not re-send it
  }  // killed
  auto next = ReplyJournal::Attach(Dup(sup->fd()));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->inherited(), 3u);
  EXPECT_FALSE(next->Find(100).has_value());  // answered and written: never re-sent
  auto answered = next->Find(102);
  ASSERT_TRUE(answered.has_value());
  EXPECT_TRUE(answered->answered);
  EXPECT_EQ(answered->opcode, 9u);
  EXPECT_EQ(answered->reply, ReplyFor(102));
  auto begun = next->Find(101);
  ASSERT_TRUE(begun.has_value());
  EXPECT_FALSE(begun->answered);
  EXPECT_EQ(begun->opcode, 35u);
  EXPECT_FALSE(next->Find(103)->answered);
  EXPECT_FALSE(next->Find(104).has_value());
  EXPECT_FALSE(next->Find(999).has_value());
}

TEST(ReplyJournalTest, RecordsStayUntilSettledOrDroppedOldestFirstWhenFull) {
  auto sup = ReplyJournal::Create(3);
  ASSERT_TRUE(sup.ok());
  {
    auto first = ReplyJournal::Attach(Dup(sup->fd()));
    ASSERT_TRUE(first.ok());
    int a = first->Claim(), b = first->Claim();
    first->Begin(a, 7, 9);
    ASSERT_TRUE(Answer(*first, a, ReplyFor(7)));
    first->Begin(b, 8, 10);
  }
  {
    // The second worker has one free slot; the records of 7 and 8 keep
    // theirs until settled, or until a claim finds no free slot: then the
    // oldest (7, never re-sent: killed after its write) goes.
    auto second = ReplyJournal::Attach(Dup(sup->fd()));
    ASSERT_TRUE(second.ok());
    int own = second->Claim();
    ASSERT_GE(own, 0);
    EXPECT_TRUE(second->Find(7).has_value());
    EXPECT_GE(second->Claim(), 0);
    EXPECT_FALSE(second->Find(7).has_value());
    EXPECT_TRUE(second->Find(8).has_value());
    second->Begin(own, 8, 10);  // it carries 8 out once more, and is killed
  }
  auto third = ReplyJournal::Attach(Dup(sup->fd()));
  ASSERT_TRUE(third.ok());
  auto eight = third->Find(8);  // begun twice: once per slot, one record
  ASSERT_TRUE(eight.has_value());
  EXPECT_FALSE(eight->answered);
  EXPECT_EQ(third->inherited(), 1u);
  int mine = third->Claim();  // the slot 7 had, claimed and left empty
  ASSERT_GE(mine, 0);
  third->Begin(mine, 9, 9);
  ASSERT_TRUE(Answer(*third, mine, ReplyFor(9)));
  third->End(mine);  // written: nothing to replay
  third->Settle(8);  // answered now: its two slots are free
  EXPECT_EQ(third->inherited(), 0u);
  EXPECT_GE(third->Claim(), 0);
  EXPECT_GE(third->Claim(), 0);
  EXPECT_EQ(third->Claim(), -1);
  auto fourth = ReplyJournal::Attach(Dup(sup->fd()));
  ASSERT_TRUE(fourth.ok());
  EXPECT_EQ(fourth->inherited(), 0u);
}

TEST(ReplyJournalTest, NotAJournal) {
  UniqueFd fd(::memfd_create("junk", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(fd.get(), 8192), 0);
  auto attached = ReplyJournal::Attach(std::move(fd));
  ASSERT_FALSE(attached.ok());
  EXPECT_EQ(attached.status().code(), EPROTO);
}

// A child process journals requests on several slots as fast as it can and
// is SIGKILLed at an arbitrary instant: every record the next worker finds
// is begun, or answered with exactly its request's reply.
TEST(ReplyJournalTest, SigkillLeavesEveryRecordEmptyBegunOrWhole) {
  auto sup = ReplyJournal::Create(16);
  ASSERT_TRUE(sup.ok());
  auto* done = static_cast<std::atomic<uint64_t>*>(::mmap(
      nullptr, sizeof(std::atomic<uint64_t>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
      -1, 0));
  ASSERT_NE(done, MAP_FAILED);
  std::mt19937_64 rng(22);
  uint64_t next_unique = 1;
  for (int round = 0; round < 20; ++round) {
    done->store(0);
    uint64_t first = next_unique;
    next_unique += 1u << 30;  // each round's ids are its own
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto journal = ReplyJournal::Attach(Dup(sup->fd()));
      if (!journal.ok()) ::_exit(2);
      int slots[4];
      for (int& s : slots) s = journal->Claim();
      for (uint64_t i = 0;; ++i) {
        uint64_t unique = first + i;
        int s = slots[i % 4];
        journal->Begin(s, unique, static_cast<uint32_t>(unique % 50));
        if (unique % 3 != 0) Answer(*journal, s, ReplyFor(unique));
        if (unique % 7 == 0) journal->End(s);
        done->store(i + 1, std::memory_order_relaxed);
      }
    }
    uint64_t kill_after = 1000 + rng() % 50000;
    while (done->load(std::memory_order_relaxed) < kill_after) {
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, WNOHANG), 0) << "the journaling child ended early";
    }
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status));

    auto next = ReplyJournal::Attach(Dup(sup->fd()));
    ASSERT_TRUE(next.ok());
    uint64_t seen = 0;
    for (uint64_t unique = first + done->load() - 8; unique <= first + done->load() + 4; ++unique) {
      auto rec = next->Find(unique);
      if (!rec) continue;
      ++seen;
      next->Settle(unique);  // the next round's child starts from an empty journal
      EXPECT_EQ(rec->opcode, unique % 50) << unique;
      if (rec->answered) {
        EXPECT_EQ(rec->reply, ReplyFor(unique)) << unique;
      }
      if (unique % 3 == 0) {
        EXPECT_FALSE(rec->answered) << unique;
      }
      if (unique < first + done->load()) {
        EXPECT_NE(unique % 7, 0u) << unique;  // completed and ended: gone
      }
    }
    // The four slots but the one being rewritten and at most one ended.
    EXPECT_GE(seen, 2u);
    EXPECT_EQ(next->inherited(), 0u);
  }
  ::munmap(done, sizeof(std::atomic<uint64_t>));
}

}  // namespace
}  // namespace gpufs::takeover
