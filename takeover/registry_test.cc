// The supervisor's registry with real fds (memfds standing in for GPU VMM
// exports) over a real socketpair and a real open file table: what a worker
// reports and records is what the next worker receives, and received fds
// share the memory of the originals.
#include "takeover/registry.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "takeover/test_memfd.h"

namespace gpufs::takeover {
namespace {

struct Pair {
  UniqueFd a, b;
};

Pair Channel() {
  auto p = MakeChannelPair();
  EXPECT_TRUE(p.ok());
  return {std::move(p->first), std::move(p->second)};
}

// The supervisor's table and a worker's attachment of it.
struct Tables {
  OpenFileTable supervisor;
  OpenFileTable worker;
};

Tables MakeTables(uint32_t slots = 1 << 16) {
  auto made = OpenFileTable::Create(slots);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  auto attached = OpenFileTable::Attach(UniqueFd(::dup(made->fd())));
  EXPECT_TRUE(attached.ok()) << attached.status().ToString();
  return {std::move(*made), std::move(*attached)};
}

// Sends from the "worker" end and applies on the "supervisor" end.
void SendApply(Pair& ch, Registry& reg, MsgType type, std::span<const std::byte> payload,
               std::span<const int> fds = {}) {
  ASSERT_TRUE(Send(ch.b.get(), type, payload, fds).ok());
  auto m = Receive(ch.a.get());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->type, type);
  Status applied = reg.Apply(std::move(*m));
  ASSERT_TRUE(applied.ok()) << applied.ToString();
}

// The registry's handover to a new worker over a fresh channel, received
// beside the sending (the socket buffer holds only so much).
Result<Handover> HandOver(Registry& reg, uint32_t generation = 2) {
  Pair w = Channel();
  Result<Handover> got = Error(EIO, "not run");
  std::thread receiver([&] { got = ReceiveHandover(w.b.get()); });
  Status sent = reg.SendHandover(w.a.get(), generation, 1);
  receiver.join();
  if (!sent.ok()) return sent;
  return got;
}

TEST(RegistryTest, HandoverCarriesInitHandlesAndBlobFds) {
  Tables t = MakeTables();
  Registry reg(t.supervisor);
  Pair w1 = Channel();
  std::string init(104, 'i');
  SendApply(w1, reg, MsgType::kInit, std::as_bytes(std::span(init)));
  EXPECT_FALSE(reg.init_answered());
  SendApply(w1, reg, MsgType::kInitAnswered, {});
  HandleRecord h1{
      .fh = 11, .entry = 5, .blob = 7, .unique = 99, .flags = kHandleWritable, .pid = 42};
  HandleRecord h2{.fh = 12, .entry = 6, .blob = 8, .unique = 100, .flags = 0, .pid = 43};
  ASSERT_TRUE(t.worker.Put(h1));
  ASSERT_TRUE(t.worker.Put(h2));
  ASSERT_TRUE(t.worker.AddFlags(h2.fh, kHandleMapped));
  ASSERT_TRUE(t.worker.Remove(h1.fh));
  UniqueFd blob7 = MemfdWith("seven"), blob8 = MemfdWith("eight");
  uint64_t id7 = 7;
  BlobFd add7{7, 2 << 20, 0, 2 << 20, 70}, add8{8, 4 << 20, 1024, 512, 80};
  int fd7 = blob7.get(), fd8 = blob8.get();
  SendApply(w1, reg, MsgType::kBlobAdd, AsBytes(add7), std::span(&fd7, 1));
  SendApply(w1, reg, MsgType::kBlobAdd, AsBytes(add8), std::span(&fd8, 1));
  EXPECT_EQ(reg.blob_bytes(8), 4u << 20);
  SendApply(w1, reg, MsgType::kBlobFree, AsBytes(id7));
  blob7.reset();  // the worker's copies go away with the worker
  EXPECT_EQ(reg.handles(), 1u);
  EXPECT_EQ(reg.blobs(), 1u);

  Pair w2 = Channel();
  ASSERT_TRUE(reg.SendHandover(w2.a.get(), 2, 1234).ok());
  auto h = ReceiveHandover(w2.b.get());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->hello.generation, 2u);
  EXPECT_EQ(h->hello.restarts, 1u);
  EXPECT_EQ(h->hello.supervisor_pid, 1234);
  EXPECT_EQ(h->hello.init_answered, 1u);
  ASSERT_TRUE(h->init.has_value());
  EXPECT_EQ(*h->init, init);
  ASSERT_EQ(h->handles.size(), 1u);
  EXPECT_EQ(h->handles[0].fh, 12u);
  EXPECT_EQ(h->handles[0].flags, kHandleMapped);
  EXPECT_EQ(h->handles[0].unique, 100u);
  EXPECT_EQ(h->handles[0].pid, 43u);
  ASSERT_EQ(h->blob_fds.size(), 1u);
  ASSERT_TRUE(h->blob_fds.count(8));
  // Where the blob is in the memory travels with its fd.
  EXPECT_EQ(h->blob_records[8].bytes, 4u << 20);
  EXPECT_EQ(h->blob_records[8].offset, 1024u);
  EXPECT_EQ(h->blob_records[8].range, 512u);
  EXPECT_EQ(h->blob_records[8].memory, 80u);
  int received = h->blob_fds[8].get();
  EXPECT_EQ(ReadAll(received), "eight");
  // The same memory, not a copy: a write through one shows through the other.
  ASSERT_EQ(::pwrite(received, "E", 1, 0), 1);
  EXPECT_EQ(ReadAll(blob8.get()), "Eight");
  // The first worker's copy goes; the registry's keeps the memory alive.
  blob8.reset();
  h->blob_fds.clear();
  EXPECT_EQ(ReadAll(reg.blob_fd(8)), "Eight");
}

TEST(RegistryTest, UnsealedSizesAreHandedOverWhileAHandleHoldsTheBlob) {
  Tables t = MakeTables();
  Registry reg(t.supervisor);
  HandleRecord a{.fh = 1, .entry = 2, .blob = 9, .flags = kHandleWritable};
  HandleRecord b{.fh = 2, .entry = 2, .blob = 9};
  ASSERT_TRUE(t.worker.Put(a));
  ASSERT_TRUE(t.worker.Put(b));
  ASSERT_TRUE(t.worker.SetSize(9, 4096));
  EXPECT_FALSE(t.worker.SetSize(10, 1));  // no handle holds blob 10: nothing to keep
  auto handover = [&] {
    Pair w2 = Channel();
    EXPECT_TRUE(reg.SendHandover(w2.a.get(), 2, 1).ok());
    auto h = ReceiveHandover(w2.b.get());
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    return h.ok() ? h->sizes : std::map<uint64_t, uint64_t>{};
  };
  EXPECT_EQ(handover(), (std::map<uint64_t, uint64_t>{{9, 4096}}));
  ASSERT_TRUE(t.worker.Remove(a.fh));
  EXPECT_EQ(handover(), (std::map<uint64_t, uint64_t>{{9, 4096}}));  // b still holds it
  ASSERT_TRUE(t.worker.Remove(b.fh));
  EXPECT_TRUE(handover().empty());
}

TEST(RegistryTest, MessagesQueuedBeforeTheWorkerDiedAreStillRead) {
  Tables t = MakeTables();
  Registry reg(t.supervisor);
  Pair w = Channel();
  UniqueFd blob = MemfdWith("late");
  BlobFd add{3, 4096, 0, 4096, 3};
  int fd = blob.get();
  std::string init(64, 'i');
  ASSERT_TRUE(Send(w.b.get(), MsgType::kInit, std::as_bytes(std::span(init))).ok());
  ASSERT_TRUE(Send(w.b.get(), MsgType::kBlobAdd, AsBytes(add), std::span(&fd, 1)).ok());
  w.b.reset();  // the worker is gone
  blob.reset();
  int applied = 0;
  for (;;) {
    auto m = Receive(w.a.get());
    ASSERT_TRUE(m.ok());
    if (m->type == MsgType::kEof) break;
    ASSERT_TRUE(reg.Apply(std::move(*m)).ok());
    ++applied;
  }
  EXPECT_EQ(applied, 2);
  EXPECT_TRUE(reg.has_init());
  EXPECT_EQ(ReadAll(reg.blob_fd(3)), "late");
}

TEST(RegistryTest, MalformedMessagesAreRefusedAndChangeNothing) {
  Tables t = MakeTables();
  Registry reg(t.supervisor);
  // A blob add of only its id (no sizes) and one without its fd.
  uint64_t id = 4;
  UniqueFd blob = MemfdWith("x");
  Message short_add{MsgType::kBlobAdd, std::string(reinterpret_cast<char*>(&id), sizeof id), {}};
  short_add.fds.push_back(std::move(blob));
  EXPECT_EQ(reg.Apply(std::move(short_add)).code(), EPROTO);
  BlobFd add{4, 4096, 0, 4096, 4};
  Message no_fd{MsgType::kBlobAdd, std::string(reinterpret_cast<char*>(&add), sizeof add), {}};
  EXPECT_EQ(reg.Apply(std::move(no_fd)).code(), EPROTO);
  Message answered{MsgType::kInitAnswered, "", {}};
  EXPECT_EQ(reg.Apply(std::move(answered)).code(), EPROTO);
  Message hello{MsgType::kHello, "", {}};  // only the supervisor sends it
  EXPECT_EQ(reg.Apply(std::move(hello)).code(), EPROTO);
  EXPECT_EQ(reg.handles(), 0u);
  EXPECT_EQ(reg.blobs(), 0u);
  EXPECT_FALSE(reg.has_init());
}

// A message of a newer worker's type is refused by Apply, and the channel
// carries on: the next message is applied.
TEST(RegistryTest, AnUnknownMessageTypeIsRefusedAndTheChannelCarriesOn) {
  Tables t = MakeTables();
  Registry reg(t.supervisor);
  Pair w1 = Channel();
  ASSERT_TRUE(Send(w1.b.get(), static_cast<MsgType>(99), AsBytes(uint64_t{7})).ok());
  auto unknown = Receive(w1.a.get());
  ASSERT_TRUE(unknown.ok()) << unknown.status().ToString();
  EXPECT_EQ(reg.Apply(std::move(*unknown)).code(), EPROTO);
  UniqueFd blob = MemfdWith("after");
  BlobFd add{5, 4096, 0, 4096, 5};
  int fd = blob.get();
  SendApply(w1, reg, MsgType::kBlobAdd, AsBytes(add), std::span(&fd, 1));
  EXPECT_EQ(reg.blobs(), 1u);
}

// Many handles and fds cross in several packets each (batches of
// kHandlesPerMessage records and kMaxFds fds), and a handover of thousands of
// fds stays fast (docs/BENCHMARKS.md has the 10k figure from the benchmark).
TEST(RegistryTest, ThousandsOfHandlesAndBlobFdsCrossInBatches) {
  constexpr int kBlobs = 3000, kHandles = 5000;
  Tables t = MakeTables();
  Registry reg(t.supervisor);
  Pair w1 = Channel();
  for (int i = 1; i <= kBlobs; ++i) {
    UniqueFd blob = MemfdWith("blob" + std::to_string(i));
    BlobFd add{static_cast<uint64_t>(i), static_cast<uint64_t>(i) << 21, 0,
               static_cast<uint64_t>(i) << 21, static_cast<uint64_t>(i)};
    int fd = blob.get();
    SendApply(w1, reg, MsgType::kBlobAdd, AsBytes(add), std::span(&fd, 1));
  }
  for (int i = 1; i <= kHandles; ++i) {
    HandleRecord rec{
        .fh = static_cast<uint64_t>(i), .entry = 1, .blob = static_cast<uint64_t>(i % kBlobs + 1)};
    ASSERT_TRUE(t.worker.Put(rec));
  }
  Pair w2 = Channel();
  auto start = std::chrono::steady_clock::now();
  // The receiver runs beside the sender: the socket buffer holds only so much.
  Result<Handover> got = Error(EIO, "not run");
  std::thread receiver([&] { got = ReceiveHandover(w2.b.get()); });
  ASSERT_TRUE(reg.SendHandover(w2.a.get(), 5, 1).ok());
  receiver.join();
  auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->handles.size(), static_cast<size_t>(kHandles));
  ASSERT_EQ(got->blob_fds.size(), static_cast<size_t>(kBlobs));
  EXPECT_EQ(ReadAll(got->blob_fds[1234].get()), "blob1234");
  EXPECT_EQ(got->blob_records[1234].bytes, 1234ull << 21);
  EXPECT_EQ(got->handles[4999].fh, 5000u);
  std::printf("handover of %d handles and %d fds: %.1f ms\n", kHandles, kBlobs, ms.count());
}

// The host tier's slabs: an fd per slab (not per blob), kept apart from the
// blob fds (a blob id and a slab id may be equal), handed over in batches.
TEST(RegistryTest, HostSlabFdsAreKeptByMemoryIdAndHandedOver) {
  constexpr int kSlabs = 300;  // more than one packet's fds
  Tables t = MakeTables();
  Registry reg(t.supervisor);
  Pair w1 = Channel();
  std::vector<UniqueFd> slabs;
  for (int i = 1; i <= kSlabs; ++i) {
    slabs.push_back(MemfdWith("slab" + std::to_string(i)));
    uint64_t id = static_cast<uint64_t>(i);
    int fd = slabs.back().get();
    SendApply(w1, reg, MsgType::kMemoryAdd, AsBytes(id), std::span(&fd, 1));
  }
  UniqueFd blob = MemfdWith("blob7");
  BlobFd add{7, 2 << 20, 0, 2 << 20, 7};
  int blob_fd = blob.get();
  SendApply(w1, reg, MsgType::kBlobAdd, AsBytes(add), std::span(&blob_fd, 1));
  uint64_t gone = 5;
  SendApply(w1, reg, MsgType::kMemoryFree, AsBytes(gone));
  EXPECT_EQ(reg.memories(), static_cast<size_t>(kSlabs - 1));
  EXPECT_EQ(reg.blobs(), 1u);
  EXPECT_EQ(reg.memory_fd(5), -1);
  // A memory add without its fd is refused.
  uint64_t id = 9999;
  ASSERT_TRUE(Send(w1.b.get(), MsgType::kMemoryAdd, AsBytes(id)).ok());
  auto bad = Receive(w1.a.get());
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(reg.Apply(std::move(*bad)).code(), EPROTO);
  slabs.clear();  // the worker dies; the registry's fds keep the memory

  Result<Handover> got = HandOver(reg);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->memory_fds.size(), static_cast<size_t>(kSlabs - 1));
  EXPECT_FALSE(got->memory_fds.count(5));
  EXPECT_EQ(ReadAll(got->memory_fds[7].get()), "slab7");
  EXPECT_EQ(ReadAll(got->memory_fds[300].get()), "slab300");
  ASSERT_EQ(got->blob_fds.size(), 1u);
  EXPECT_EQ(ReadAll(got->blob_fds[7].get()), "blob7");
}

// An object written as a whole: its members' records in one message with
// the allocation's fd once. Each member keeps that memory alive by itself,
// and each is handed over with an fd of it.
TEST(RegistryTest, MembersOfOneAllocationShareOneFd) {
  Tables t = MakeTables();
  Registry reg(t.supervisor);
  Pair w1 = Channel();
  UniqueFd object = MemfdWith("object");
  std::vector<BlobFd> adds;
  for (uint64_t i = 0; i < 3; ++i) adds.push_back({100 + i, 4 << 20, i * 512, 512, 77});
  int fd = object.get();
  SendApply(w1, reg, MsgType::kBlobsAdd, std::as_bytes(std::span(adds)), std::span(&fd, 1));
  EXPECT_EQ(reg.blobs(), 3u);
  EXPECT_EQ(reg.blob_record(101).offset, 512u);
  EXPECT_EQ(reg.blob_record(102).memory, 77u);
  object.reset();  // the worker's copy goes
  uint64_t first = 100;
  SendApply(w1, reg, MsgType::kBlobFree, AsBytes(first));
  ASSERT_GE(reg.blob_fd(101), 0);  // the others still hold the memory
  EXPECT_EQ(ReadAll(reg.blob_fd(102)), "object");
  // Refused: no fd, two fds, a payload that is not whole records.
  int two[] = {reg.blob_fd(101), reg.blob_fd(102)};
  ASSERT_TRUE(Send(w1.b.get(), MsgType::kBlobsAdd, std::as_bytes(std::span(adds))).ok());
  ASSERT_TRUE(Send(w1.b.get(), MsgType::kBlobsAdd, std::as_bytes(std::span(adds)), two).ok());
  ASSERT_TRUE(Send(w1.b.get(), MsgType::kBlobsAdd, std::as_bytes(std::span(adds)).first(7),
                   std::span(two, 1))
                  .ok());
  for (int i = 0; i < 3; ++i) {
    auto bad = Receive(w1.a.get());
    ASSERT_TRUE(bad.ok());
    EXPECT_EQ(reg.Apply(std::move(*bad)).code(), EPROTO) << i;
  }
  EXPECT_EQ(reg.blobs(), 2u);

  Result<Handover> got = HandOver(reg);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->blob_fds.size(), 2u);
  EXPECT_EQ(ReadAll(got->blob_fds[101].get()), "object");
  EXPECT_EQ(ReadAll(got->blob_fds[102].get()), "object");
  EXPECT_EQ(got->blob_records[102].offset, 1024u);
}

}  // namespace
}  // namespace gpufs::takeover
