// UcxTransport between lab namespaces over real UCX (TCP on veth): this
// process fetches in "a" from cluster_peer processes serving in "b" and "c".
#include "cluster/ucx_transport.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <sstream>

#include "cluster/fetch_sinks.h"
#include "tests/cluster/lab_fixture.h"
#include "tests/cluster/pattern.h"
#include "util/crc32c.h"
#include "util/unique_fd.h"

#ifndef GPUFS_CLUSTER_PEER
#error "GPUFS_CLUSTER_PEER must name the cluster_peer binary"
#endif

namespace gpufs::cluster {
namespace {

using std::chrono::milliseconds;
using testing::Lab;
using testing::LabProcess;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kSize = 256ull << 20;
constexpr uint64_t kSeed = 7;
const ObjectRef kObject{"models/llama/w", 3};

// Host memory for a fetched buffer (mmap: no page faults counted at init).
class Buffer {
 public:
  explicit Buffer(uint64_t size) : size_(size) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
  }
  ~Buffer() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }
  std::span<std::byte> span() { return {data_, size_}; }

 private:
  std::byte* data_;
  uint64_t size_;
};

// Whether `got` is pattern `seed`, compared a chunk at a time.
bool MatchesPattern(std::span<const std::byte> got, uint64_t seed) {
  std::vector<std::byte> want(1 << 20);
  for (uint64_t at = 0; at < got.size(); at += want.size()) {
    size_t n = std::min<size_t>(want.size(), got.size() - at);
    testing::FillPattern(seed, at, {want.data(), n});
    if (std::memcmp(got.data() + at, want.data(), n) != 0) return false;
  }
  return true;
}

// The members' CRCs for the pattern: uneven segments, padding between.
std::vector<Segment> PatternSegments(uint64_t size, uint64_t seed) {
  std::vector<Segment> segs;
  const uint64_t cuts[][2] = {
      {0, 4096}, {8192, 3 * (8ull << 20) + 123}, {40ull << 20, size - (40ull << 20)}};
  std::vector<std::byte> bytes;
  for (const auto& c : cuts) {
    bytes.resize(c[1]);
    testing::FillPattern(seed, c[0], bytes);
    segs.push_back({"m" + std::to_string(segs.size()), c[0], c[1], Crc32c(0, bytes)});
  }
  return segs;
}

// Wraps a sink: counts buffers out, and runs `hook` once when `after`
// chunks have landed (to cut a link or kill a peer mid-fetch).
class WatchedSink : public FetchSink {
 public:
  explicit WatchedSink(FetchSink& inner) : inner_(inner) {}
  size_t capacity() const override { return inner_.capacity(); }
  Result<std::span<std::byte>> Acquire(uint64_t offset, uint64_t size) override {
    auto r = inner_.Acquire(offset, size);
    if (r.ok()) ++out_;
    return r;
  }
  void Land(uint64_t offset, std::span<std::byte> b, std::function<void(Status)> done) override {
    if (++landed_ == after_ && hook_) hook_();
    inner_.Land(offset, b, [this, done = std::move(done)](Status st) {
      --out_;
      done(st);
    });
  }
  void Drop(uint64_t offset, std::span<std::byte> b) override {
    --out_;
    ++dropped_;
    inner_.Drop(offset, b);
  }
  void OnLanded(int after, std::function<void()> hook) {
    after_ = after;
    hook_ = std::move(hook);
  }
  int out() const { return out_.load(); }
  int dropped() const { return dropped_.load(); }

 private:
  FetchSink& inner_;
  std::atomic<int> out_{0}, landed_{0}, dropped_{0};
  int after_ = -1;
  std::function<void()> hook_;
};

// Each test runs with one lane at each end, and with three client lanes
// against peers of two server lanes (connections spread unevenly).
class UcxTransportTest : public testing::LabTest, public ::testing::WithParamInterface<size_t> {
 protected:
  size_t ClientLanes() const { return GetParam(); }
  size_t PeerLanes() const { return GetParam() == 1 ? 1 : 2; }

  UcxTransportTest() { with_etcd_ = false; }

  void SetUp() override {
    LabTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    UcxTransportOptions o;
    o.ucx.transports = "tcp";  // the nodes share a host: keep UCX on the network
    o.client_lanes = ClientLanes();
    auto t = UcxTransport::Start(o, nullptr);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    client_ = std::move(*t);
  }

  // Starts a peer serving the pattern in `node`; its address in *address.
  std::unique_ptr<LabProcess> StartPeer(const std::string& node, std::string* address,
                                        bool copy_out = false, const ObjectRef& object = kObject,
                                        const char* mode = "--copy-out") {
    std::vector<std::string> argv = {GPUFS_CLUSTER_PEER,
                                     "serve",
                                     "--listen",
                                     Lab::Address(node) + ":" + peer_port_,
                                     "--object",
                                     object.ToString(),
                                     "--size",
                                     std::to_string(kSize),
                                     "--seed",
                                     std::to_string(kSeed),
                                     "--tls",
                                     "tcp",
                                     "--lanes",
                                     std::to_string(PeerLanes())};
    if (copy_out) argv.push_back(mode);
    auto p = LabProcess::Start(*lab_, node, argv, "peer-" + node + ".log");
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return nullptr;
    Result<std::string> line = (*p)->ReadLine(milliseconds(20000));
    EXPECT_TRUE(line.ok()) << line.status().ToString();
    std::istringstream in(line.ok() ? *line : "");
    std::string word, crc;
    in >> word >> *address >> crc >> crc;
    EXPECT_EQ(word, "listening") << *line;
    return std::move(*p);
  }

  FetchRequest Request(std::vector<SourceAddress> sources) {
    return FetchRequest{kObject, kSize, std::move(sources), PatternSegments(kSize, kSeed)};
  }

  FetchOptions Options() {
    FetchOptions o;
    o.stall_timeout = milliseconds(1500);
    o.timeout = milliseconds(30000);
    return o;
  }

  std::unique_ptr<UcxTransport> client_;
  std::string peer_port_ = "0";  // where StartPeer's peers listen
};

TEST_P(UcxTransportTest, FetchesByteIdenticalFromOneSource) {
  std::string b;
  auto peer = StartPeer("b", &b);
  ASSERT_TRUE(peer);
  Buffer dest(kSize);
  HostBufferSink sink(dest.span());
  WatchedSink watched(sink);
  Result<FetchResult> r = client_->Fetch(Request({{"b", b}}), watched, Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->bytes, kSize);
  ASSERT_EQ(r->sources.size(), 1u);
  EXPECT_EQ(r->sources[0].bytes, kSize);
  EXPECT_EQ(watched.out(), 0);
  EXPECT_TRUE(MatchesPattern(dest.span(), kSeed));
  std::printf("one source: %.0f MB/s\n", kSize / r->seconds / 1e6);
}

TEST_P(UcxTransportTest, ReceivesOnEveryLaneAndSendsFromEveryLane) {
  std::string b;
  auto peer = StartPeer("b", &b);
  ASSERT_TRUE(peer);
  Buffer dest(kSize);
  HostBufferSink sink(dest.span());
  Result<FetchResult> r = client_->Fetch(Request({{"b", b}}), sink, Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->sources.size(), 1u);
  EXPECT_EQ(r->sources[0].connections, ClientLanes());
  EXPECT_EQ(r->sources[0].bytes, kSize);
  EXPECT_TRUE(MatchesPattern(dest.span(), kSeed));
  Result<std::string> stats = peer->Ask("stats", milliseconds(5000));
  ASSERT_TRUE(stats.ok());
  nlohmann::json server = nlohmann::json::parse(*stats)["server"];
  EXPECT_EQ(server["connections_total"], ClientLanes()) << server.dump();
  ASSERT_EQ(server["lanes"].size(), PeerLanes()) << server.dump();
  uint64_t sum = 0;
  for (const auto& lane : server["lanes"]) {
    EXPECT_GT(lane["bytes_served"].get<uint64_t>(), 0u) << server.dump();
    sum += lane["bytes_served"].get<uint64_t>();
  }
  EXPECT_EQ(sum, kSize);
}

TEST_P(UcxTransportTest, SplitsAmongSeveralSources) {
  std::string b, c;
  auto pb = StartPeer("b", &b);
  auto pc = StartPeer("c", &c);
  ASSERT_TRUE(pb && pc);
  Buffer dest(kSize);
  HostBufferSink sink(dest.span());
  Result<FetchResult> r = client_->Fetch(Request({{"b", b}, {"c", c}}), sink, Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->sources.size(), 2u);
  EXPECT_GT(r->sources[0].bytes, 0u);
  EXPECT_GT(r->sources[1].bytes, 0u);
  EXPECT_EQ(r->sources[0].bytes + r->sources[1].bytes, kSize);
  EXPECT_TRUE(MatchesPattern(dest.span(), kSeed));
}

TEST_P(UcxTransportTest, StagesAtBothEnds) {
  // The GPU path's shape on host memory: the server reads through CopyOut
  // into its staging pool, the client lands in staging buffers and copies
  // on from a thread of its own.
  std::string b;
  auto peer = StartPeer("b", &b, /*copy_out=*/true);
  ASSERT_TRUE(peer);
  Buffer dest(kSize);
  auto staged =
      StagedSink::Create(2, 8 << 20, [&](uint64_t offset, std::span<const std::byte> bytes) {
        std::memcpy(dest.span().data() + offset, bytes.data(), bytes.size());
        return Status();
      });
  ASSERT_TRUE(staged.ok());
  Result<FetchResult> r = client_->Fetch(Request({{"b", b}}), **staged, Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*staged)->copied_bytes(), kSize);
  EXPECT_TRUE(MatchesPattern(dest.span(), kSeed));
  Result<std::string> stats = peer->Ask("stats", milliseconds(5000));
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(nlohmann::json::parse(*stats)["server"]["copied_out"], 32);
}

TEST_P(UcxTransportTest, SendsRangesInPlaceAndLetsEachHoldGoOnceSent) {
  // The peer hands out the ranges of even 8 MiB units in place and copies
  // the others out; each in-place range's hold lives until its send is done.
  std::string b;
  auto peer = StartPeer("b", &b, /*copy_out=*/true, kObject, "--in-place");
  ASSERT_TRUE(peer);
  Buffer dest(kSize);
  HostBufferSink sink(dest.span());
  Result<FetchResult> r = client_->Fetch(Request({{"b", b}}), sink, Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(MatchesPattern(dest.span(), kSeed));
  // The last sends complete on the peer's side once our side has taken
  // their bytes: polled, with a deadline.
  nlohmann::json s;
  for (const auto end = Clock::now() + milliseconds(5000);;) {
    Result<std::string> stats = peer->Ask("stats", milliseconds(5000));
    ASSERT_TRUE(stats.ok());
    s = nlohmann::json::parse(*stats);
    if (s["holds_live"] == 0 || Clock::now() > end) break;
  }
  EXPECT_EQ(s["server"]["sent_in_place"], 16) << s.dump();
  EXPECT_EQ(s["server"]["copied_out"], 16) << s.dump();
  EXPECT_EQ(s["holds_live"], 0) << s.dump();
}

// An object's members where they lie in host memory, the padding between
// them not theirs: into anonymous memory, a range inside one member lands
// there directly and a range across a member's end through staging; into
// a file's mapping (the memory host tier's memfd) every range is staged
// and written with pwrite, unless the file's pages are backed already (the
// host tier's reserve): then as into anonymous memory, with the member's
// own bytes handed to the network. Either way no byte outside the members
// is written.
void FetchIntoMembers(UcxTransport& client, const std::string& b, bool in_file,
                      uint64_t want_staged, bool backed = false) {
  UniqueFd file(in_file ? ::memfd_create("members", MFD_CLOEXEC) : -1);
  if (in_file) {
    ASSERT_EQ(::ftruncate(file.get(), kSize), 0);
  }
  void* map = in_file ? ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, file.get(), 0)
                      : ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  std::span<std::byte> dest(static_cast<std::byte*>(map), kSize);
  std::memset(dest.data(), 0xee, kSize);
  std::vector<InPlaceSink::Piece> pieces;
  for (const Segment& s : PatternSegments(kSize, kSeed))
    pieces.push_back({s.offset, dest.subspan(s.offset, s.size), file.get(), s.offset, backed});
  auto sink = InPlaceSink::Create(pieces, 16, 8 << 20);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  {
    const InPlaceSink::Piece& p = pieces[1];
    auto got = (*sink)->Acquire(p.offset, 4096);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->data() == p.bytes.data(), !in_file || backed) << "received in place";
    (*sink)->Drop(p.offset, *got);
  }
  WatchedSink watched(**sink);
  FetchOptions o;
  o.stall_timeout = milliseconds(1500);
  o.timeout = milliseconds(30000);
  Result<FetchResult> r = client.Fetch(
      FetchRequest{kObject, kSize, {{"b", b}}, PatternSegments(kSize, kSeed)}, watched, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(watched.out(), 0);
  EXPECT_EQ((*sink)->staged_bytes(), want_staged);
  std::vector<std::byte> want;
  for (const InPlaceSink::Piece& p : pieces) {
    want.resize(p.bytes.size());
    testing::FillPattern(kSeed, p.offset, want);
    EXPECT_EQ(std::memcmp(p.bytes.data(), want.data(), want.size()), 0) << "at " << p.offset;
  }
  for (uint64_t at : {uint64_t{4096}, uint64_t{8191}, uint64_t{8192 + 3 * (8ull << 20) + 123},
                      uint64_t{(40ull << 20) - 1}})
    EXPECT_EQ(dest[at], std::byte{0xee}) << "padding at " << at << " was written";
  ::munmap(map, kSize);
}

TEST_P(UcxTransportTest, IntoMembersInPlaceOrThroughTheirFile) {
  std::string b;
  auto peer = StartPeer("b", &b);
  ASSERT_TRUE(peer);
  // Of the 8 MiB chunks, 0 and 3 cross a member's end and 4 holds none;
  // the others lie inside one member.
  FetchIntoMembers(*client_, b, /*in_file=*/false, 3ull * (8 << 20));
  FetchIntoMembers(*client_, b, /*in_file=*/true, kSize);
  FetchIntoMembers(*client_, b, /*in_file=*/true, 3ull * (8 << 20), /*backed=*/true);
}

TEST_P(UcxTransportTest, CutLinkMidFetchCompletesFromTheOtherSource) {
  std::string b, c;
  auto pb = StartPeer("b", &b);
  auto pc = StartPeer("c", &c);
  ASSERT_TRUE(pb && pc);
  Buffer dest(kSize);
  HostBufferSink sink(dest.span());
  WatchedSink watched(sink);
  watched.OnLanded(4, [&] { ASSERT_OK(lab_->SetLink("b", false)); });
  FetchOptions o = Options();
  auto t0 = Clock::now();
  Result<FetchResult> r = client_->Fetch(Request({{"b", b}, {"c", c}}), watched, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_LT(Clock::now() - t0, o.stall_timeout + milliseconds(10000));
  EXPECT_EQ(r->sources[0].failure.code(), ETIMEDOUT) << r->sources[0].failure.ToString();
  EXPECT_TRUE(r->sources[1].failure.ok());
  EXPECT_GT(r->requeued_chunks, 0u);
  EXPECT_EQ(r->sources[0].bytes + r->sources[1].bytes, kSize);
  EXPECT_EQ(watched.out(), 0);
  EXPECT_TRUE(MatchesPattern(dest.span(), kSeed));
}

TEST_P(UcxTransportTest, CutLinkOfTheOnlySourceFailsWithinTheStallTimeout) {
  std::string b;
  auto pb = StartPeer("b", &b);
  ASSERT_TRUE(pb);
  Buffer dest(kSize);
  HostBufferSink sink(dest.span());
  WatchedSink watched(sink);
  Clock::time_point cut;
  watched.OnLanded(3, [&] {
    ASSERT_OK(lab_->SetLink("b", false));
    cut = Clock::now();
  });
  FetchOptions o = Options();
  Result<FetchResult> r = client_->Fetch(Request({{"b", b}}), watched, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ETIMEDOUT) << r.status().ToString();
  EXPECT_LT(Clock::now() - cut, o.stall_timeout + milliseconds(1500));
  EXPECT_EQ(watched.out(), 0);  // nothing outstanding into the sink
}

TEST_P(UcxTransportTest, KilledSourceMidFetchCompletesFromTheOther) {
  std::string b, c;
  auto pb = StartPeer("b", &b);
  auto pc = StartPeer("c", &c);
  ASSERT_TRUE(pb && pc);
  Buffer dest(kSize);
  HostBufferSink sink(dest.span());
  WatchedSink watched(sink);
  watched.OnLanded(4, [&] { pb->Kill(); });
  auto t0 = Clock::now();
  Result<FetchResult> r = client_->Fetch(Request({{"b", b}, {"c", c}}), watched, Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->sources[0].failure.ok());
  // A dead process resets its connections: no need to wait for a stall.
  EXPECT_LT(Clock::now() - t0, milliseconds(8000));
  EXPECT_TRUE(MatchesPattern(dest.span(), kSeed));
}

// A source killed mid-fetch leaves its connections in TIME_WAIT on its
// port; a process started in its place listens there at once (as a node
// restarted, or its worker taken over, must), and serves.
TEST_P(UcxTransportTest, AKilledSourcesPortIsListenedOnAgainAtOnce) {
  std::string b;
  auto pb = StartPeer("b", &b);
  ASSERT_TRUE(pb);
  {
    Buffer dest(kSize);
    HostBufferSink sink(dest.span());
    WatchedSink watched(sink);
    watched.OnLanded(4, [&] { pb->Kill(); });
    EXPECT_FALSE(client_->Fetch(Request({{"b", b}}), watched, Options()).ok());
  }
  peer_port_ = b.substr(b.rfind(':') + 1);
  std::string again;
  auto second = StartPeer("b", &again);
  ASSERT_TRUE(second);
  EXPECT_EQ(again, b);
  Buffer dest(kSize);
  HostBufferSink sink(dest.span());
  Result<FetchResult> r = client_->Fetch(Request({{"b", again}}), sink, Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(MatchesPattern(dest.span(), kSeed));
}

TEST_P(UcxTransportTest, StoppedSourceIsDroppedAsStalled) {
  std::string b, c;
  auto pb = StartPeer("b", &b);
  auto pc = StartPeer("c", &c);
  ASSERT_TRUE(pb && pc);
  Buffer dest(kSize);
  HostBufferSink sink(dest.span());
  WatchedSink watched(sink);
  watched.OnLanded(2, [&] { ASSERT_OK(pb->Pause()); });
  Result<FetchResult> r = client_->Fetch(Request({{"b", b}, {"c", c}}), watched, Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->sources[0].failure.code(), ETIMEDOUT);
  EXPECT_TRUE(MatchesPattern(dest.span(), kSeed));
  ASSERT_OK(pb->Resume());
}

TEST_P(UcxTransportTest, SourceWithoutTheObjectIsSkipped) {
  std::string b, c;
  auto pb = StartPeer("b", &b, false, ObjectRef{kObject.path, kObject.version + 1});
  auto pc = StartPeer("c", &c);
  ASSERT_TRUE(pb && pc);
  Buffer dest(kSize);
  HostBufferSink sink(dest.span());
  Result<FetchResult> r = client_->Fetch(Request({{"b", b}, {"c", c}}), sink, Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->sources[0].failure.code(), ENOENT);
  EXPECT_EQ(r->sources[1].bytes, kSize);
  Result<FetchResult> alone = client_->Fetch(Request({{"b", b}}), sink, Options());
  EXPECT_EQ(alone.status().code(), ENOENT) << alone.status().ToString();
}

TEST_P(UcxTransportTest, ChecksumMismatchFailsNamingTheMember) {
  std::string b;
  auto pb = StartPeer("b", &b);
  ASSERT_TRUE(pb);
  Buffer dest(kSize);
  HostBufferSink sink(dest.span());
  WatchedSink watched(sink);
  FetchRequest req = Request({{"b", b}});
  req.segments[1].crc32c ^= 1;
  Result<FetchResult> r = client_->Fetch(req, watched, Options());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), EIO);
  EXPECT_NE(r.status().message().find("'m1'"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(watched.out(), 0);
}

TEST_P(UcxTransportTest, UnreachableSourcesFailCleanly) {
  Buffer dest(1 << 20);
  HostBufferSink sink(dest.span());
  FetchRequest req{kObject, 1 << 20, {{"c", Lab::Address("c") + ":9"}}, {}};
  auto t0 = Clock::now();
  Result<FetchResult> r = client_->Fetch(req, sink, Options());
  EXPECT_FALSE(r.ok());
  EXPECT_LT(Clock::now() - t0, Options().stall_timeout + milliseconds(1500))
      << r.status().ToString();
  EXPECT_EQ(client_->Fetch({kObject, 1, {}, {}}, sink, Options()).status().code(), EINVAL);
  req.sources = {{"x", "not-an-address"}};
  EXPECT_EQ(client_->Fetch(req, sink, Options()).status().code(), EINVAL);
  req.segments = {{"m", 0, 2 << 20, 0}};
  EXPECT_EQ(client_->Fetch(req, sink, Options()).status().code(), EINVAL);
}

INSTANTIATE_TEST_SUITE_P(Lanes, UcxTransportTest, ::testing::Values(size_t{1}, size_t{3}),
                         [](const ::testing::TestParamInfo<size_t>& p) {
                           return std::to_string(p.param) + "lanes";
                         });

}  // namespace
}  // namespace gpufs::cluster
