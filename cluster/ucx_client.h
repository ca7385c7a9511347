// UcxClient: pulls an object's buffer from one or several peers' UcxServer
// (protocol in ucx_server.h), into a FetchSink.
//
// A fetch splits the buffer into chunks (FetchOptions::chunk_bytes) and
// keeps up to `window` requests in flight per source (one at first, more
// while its chunks complete well within stall_timeout: on a slow link the
// ranges in flight would share it and none complete in time), handing the
// next queued chunk to whichever source has room: faster sources take more, so
// the split follows each path's speed. Every landed chunk is checksummed at
// once (SegmentVerifier), on a thread of its own so that the network
// thread goes on receiving meanwhile. A source that fails — its connection resets, it
// answers with an error (it does not hold the object), or it stalls (no
// chunk completed for stall_timeout, which is how a cut link or a stopped
// process shows) — is dropped: its endpoint is force-closed, which cancels
// the receives in flight from it, and its chunks go back to the queue for
// the others. With no source left, or past the fetch's timeout, the fetch
// fails; it returns only when no receive into the sink is outstanding.
//
// Lanes: the client moves bytes on `lanes` worker threads (ucx_client_lane.h),
// each with its own UCP worker, and opens one connection to each source on
// every lane; the connections of all sources take chunks from one queue, so
// a source's bytes are received on as many cores as there are lanes (a
// server with lanes sends them from as many: ucx_server.h). When one
// connection of a source fails or stalls, the source is dropped with all
// its connections (they share its link and its process).
//
// Threading: the fetch state machine runs on the client's own loop thread
// for all fetches; Fetch blocks the calling thread until its fetch ends.
// Callbacks into the sink run on the loop thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cluster/transport.h"
#include "cluster/ucx_client_lane.h"
#include "cluster/ucx_util.h"

namespace gpufs::cluster {

class UcxClient {
 public:
  // EINVAL for lanes 0 or over kMaxLanes.
  static Result<std::unique_ptr<UcxClient>> Start(ucp_context_h context, size_t lanes = 1);
  // Fails the fetches in flight (ECANCELED) and waits for them.
  ~UcxClient();
  UcxClient(const UcxClient&) = delete;
  UcxClient& operator=(const UcxClient&) = delete;

  // See Transport::Fetch. EINVAL for a request without sources, a sink of
  // capacity 0, or segments that leave the buffer.
  Result<FetchResult> Fetch(const FetchRequest& request, FetchSink& sink,
                            const FetchOptions& options);
  // Fetches in flight: object, bytes so far, size, seconds, MB/s.
  nlohmann::json Stats() const;

 private:
  struct Job;
  struct Mailbox;

  explicit UcxClient(std::unique_ptr<UcxWorkerLoop> loop);

  // All below run on the loop thread (ucx_fetch.cc).
  UcxWorkerLoop::Clock::time_point Tick();
  void StartJob(std::unique_ptr<Job> job);
  void Schedule(Job& job);
  void SendRequest(Job& job, size_t source, size_t chunk);
  void RequestDone(uint64_t request_id, ucs_status_t status, int reply_error);
  void ConnectionFailed(uint64_t conn, ucs_status_t status);
  void Arrived(Job& job, size_t chunk);
  void Verified(uint64_t job_id, size_t chunk, const std::vector<uint32_t>& crcs);
  void StartLanding(Job& job, size_t chunk);
  void VerifyThread();  // its own thread: checksums landed chunks
  void LandDone(uint64_t job_id, size_t chunk, const Status& status);
  void SourceFailed(Job& job, size_t source, const Status& why);
  void DropChunk(Job& job, size_t chunk, bool requeue);
  void FailJob(Job& job, const Status& why);
  void MaybeFinish(Job& job);
  void CloseConnection(Job& job, size_t source, bool force);
  void FailAll();  // every job, ECANCELED: the client is stopping
  void Shutdown();

  std::unique_ptr<UcxWorkerLoop> loop_;  // the state machine's thread; its worker is unused
  std::vector<std::unique_ptr<UcxClientLane>> lanes_;
  std::shared_ptr<Mailbox> mailbox_;  // how sinks' and lanes' threads reach the loop

  // Loop thread only.
  uint64_t next_request_id_ = 1;
  uint64_t next_job_id_ = 1;
  uint64_t next_conn_ = 1;
  bool stopping_ = false;  // the destructor runs: no new requests
  std::map<uint64_t, std::unique_ptr<Job>> jobs_;
  struct InFlight {
    uint64_t job;
    size_t chunk;
  };
  std::unordered_map<uint64_t, InFlight> in_flight_;  // by request id
  struct ConnectionOwner {
    uint64_t job;
    size_t source;
  };
  std::unordered_map<uint64_t, ConnectionOwner> connections_;  // by connection id
  std::vector<std::tuple<uint64_t, size_t, Status>> landed_;
  std::vector<uint64_t> ended_;  // jobs to erase at the end of the tick

  // Chunks to checksum, for the verify thread.
  struct VerifyJob {
    uint64_t job;
    size_t chunk;
    std::span<const std::byte> bytes;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
  };
  std::mutex verify_mu_;
  std::condition_variable verify_cv_;
  std::deque<VerifyJob> verify_queue_;  // GUARDED_BY(verify_mu_)
  bool verify_stop_ = false;            // GUARDED_BY(verify_mu_)
  std::thread verify_thread_;

  // For Stats(), from any thread.
  struct Progress {
    std::string object;
    uint64_t size = 0;
    std::atomic<uint64_t> bytes{0};
    std::chrono::steady_clock::time_point start;
    size_t sources = 0;
  };
  mutable std::mutex stats_mu_;
  std::map<uint64_t, std::shared_ptr<Progress>> progress_;  // GUARDED_BY(stats_mu_)
};

}  // namespace gpufs::cluster
