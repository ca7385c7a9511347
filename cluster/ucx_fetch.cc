// UcxClient's fetch state machine (see ucx_client.h). Every function here
// runs on the loop thread. A chunk goes kQueued -> kRequested (a buffer from
// the sink, lent to a lane with the request) -> kVerifying (on the verify
// thread) -> kLanding (checked, given to the sink) -> kDone (the sink gave
// the buffer back). A failed connection's kRequested chunks are orphaned:
// its lane cancels them, and each goes back to the queue when the lane
// gives its buffer back (or is used, if its bytes had arrived after all).
#include <algorithm>

#include "cluster/ucx_client_internal.h"
#include "util/log.h"

namespace gpufs::cluster {
namespace {

using Clock = UcxWorkerLoop::Clock;

std::string Describe(const SourceAddress& s) { return s.node + " (" + s.address + ")"; }

}  // namespace

void UcxClient::StartJob(std::unique_ptr<Job> owned) {
  Job& job = *owned;
  job.id = next_job_id_++;
  job.start = Clock::now();
  job.deadline = job.start + job.options.timeout;
  const uint64_t n = (job.request.size + job.options.chunk_bytes - 1) / job.options.chunk_bytes;
  job.chunks.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    job.chunks[i].offset = i * job.options.chunk_bytes;
    job.chunks[i].size = std::min(job.options.chunk_bytes, job.request.size - job.chunks[i].offset);
    job.queue.push_back(i);
  }
  {
    std::lock_guard lock(stats_mu_);
    progress_[job.id] = job.progress;
  }
  jobs_[job.id] = std::move(owned);
  job.nodes.resize(job.request.sources.size());
  if (stopping_) return FailJob(job, Error(ECANCELED, "the UCX client is shutting down"));
  // One connection to each source on every lane, interleaved, so that the
  // first chunks, which go one to each connection, spread over sources.
  for (size_t lane = 0; lane < lanes_.size(); ++lane) {
    for (size_t node = 0; node < job.request.sources.size(); ++node) {
      Job::Source src;
      src.address = job.request.sources[node];
      src.node = node;
      src.lane = lane;
      src.last_progress = job.start;
      job.sources.push_back(std::move(src));
    }
  }
  for (size_t i = 0; i < job.sources.size(); ++i) {
    Job::Source& src = job.sources[i];
    Result<sockaddr_storage> addr = ParseHostPort(src.address.address);
    if (!addr.ok()) {
      src.failure = addr.status();
      if (src.lane == 0)
        GPUFS_LOG(WARN) << "fetch " << job.request.object.ToString() << ": "
                        << src.failure.ToString();
      continue;
    }
    src.conn = next_conn_++;
    connections_[src.conn] = {job.id, i};
    lanes_[src.lane]->Connect(src.conn, *addr);
  }
  Schedule(job);
}

void UcxClient::Schedule(Job& job) {
  if (job.ended) return;
  if (job.finishing) return MaybeFinish(job);
  if (stopping_) return;
  while (!job.queue.empty() && job.out < job.sink->capacity()) {
    size_t best = job.sources.size();
    for (size_t i = 0; i < job.sources.size(); ++i) {
      const Job::Source& s = job.sources[i];
      const Job::Node& node = job.nodes[s.node];
      if (s.failed() || s.conn == 0 || node.in_flight >= node.window) continue;
      if (best == job.sources.size() || s.in_flight < job.sources[best].in_flight) best = i;
    }
    if (best == job.sources.size()) break;
    const size_t c = job.queue.front();
    Job::Chunk& chunk = job.chunks[c];
    Result<std::span<std::byte>> buffer = job.sink->Acquire(chunk.offset, chunk.size);
    if (!buffer.ok() || buffer->size() < chunk.size) {
      return FailJob(job, buffer.ok() ? Error(EINVAL, "the sink gave a buffer too small")
                                      : buffer.status().Prepend("fetch sink"));
    }
    job.queue.pop_front();
    ++job.out;
    chunk.buffer = buffer->first(chunk.size);
    SendRequest(job, best, c);
    if (job.finishing) return MaybeFinish(job);
  }
  const bool any_source = std::any_of(job.sources.begin(), job.sources.end(),
                                      [](const Job::Source& s) { return !s.failed(); });
  if (!any_source && job.done < job.chunks.size()) {
    std::string why;
    int code = EHOSTUNREACH;
    for (const Job::Source& s : job.sources) {
      if (s.lane != 0) continue;  // each source once: its first connection's failure
      why += (why.empty() ? "" : "; ") + s.address.node + ": " + s.failure.ToString();
      code = s.failure.code();
    }
    return FailJob(job, Error(code, "fetch " + job.request.object.ToString() +
                                        ": no source left (" + why + ")"));
  }
  if (job.done == job.chunks.size()) MaybeFinish(job);
}

void UcxClient::SendRequest(Job& job, size_t source, size_t c) {
  Job::Source& src = job.sources[source];
  Job::Chunk& chunk = job.chunks[c];
  chunk.state = Job::Chunk::State::kRequested;
  chunk.source = source;
  chunk.orphaned = false;
  chunk.request_id = next_request_id_++;
  chunk.requested = Clock::now();
  in_flight_[chunk.request_id] = {job.id, c};
  if (src.in_flight == 0) src.last_progress = Clock::now();  // idle until now: not a stall
  ++src.in_flight;
  ++job.nodes[src.node].in_flight;
  ++job.requested;
  ReadRequest header;
  header.request_id = chunk.request_id;
  header.version = job.request.object.version;
  header.offset = chunk.offset;
  header.length = chunk.size;
  lanes_[src.lane]->Request(src.conn, header, job.path, chunk.buffer);
}

UcxWorkerLoop::Clock::time_point UcxClient::Tick() {
  while (!landed_.empty()) {
    auto landed = std::exchange(landed_, {});
    for (auto& [job, chunk, st] : landed) LandDone(job, chunk, st);
  }

  // Stalls and deadlines.
  Clock::time_point next = Clock::time_point::max();
  const auto now = Clock::now();
  std::vector<uint64_t> ids;
  for (auto& [id, job] : jobs_) ids.push_back(id);
  for (uint64_t id : ids) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    Job& job = *it->second;
    if (job.finishing || job.ended) continue;
    if (now >= job.deadline) {
      FailJob(job, Error(ETIMEDOUT, "fetch " + job.request.object.ToString() + ": not done after " +
                                        std::to_string(job.options.timeout.count()) + " ms"));
      continue;
    }
    next = std::min(next, job.deadline);
    for (size_t i = 0; i < job.sources.size(); ++i) {
      Job::Source& s = job.sources[i];
      if (s.failed() || s.in_flight == 0) continue;
      auto stall_at = s.last_progress + job.options.stall_timeout;
      if (now >= stall_at) {
        SourceFailed(
            job, i,
            Error(ETIMEDOUT, Describe(s.address) + ": no data for " +
                                 std::to_string(job.options.stall_timeout.count()) + " ms"));
        if (job.finishing || job.ended) break;
      } else {
        next = std::min(next, stall_at);
      }
    }
  }
  for (uint64_t id : std::exchange(ended_, {})) jobs_.erase(id);
  return next;
}

void UcxClient::RequestDone(uint64_t request_id, ucs_status_t status, int reply_error) {
  auto it = in_flight_.find(request_id);
  if (it == in_flight_.end()) return;
  auto jit = jobs_.find(it->second.job);
  const size_t c = it->second.chunk;
  in_flight_.erase(it);
  if (jit == jobs_.end()) return;
  Job& job = *jit->second;
  Job::Chunk& chunk = job.chunks[c];
  if (chunk.state != Job::Chunk::State::kRequested || chunk.request_id != request_id) return;
  --job.requested;
  if (status == UCS_OK && reply_error == 0) return Arrived(job, c);
  Job::Source& src = job.sources[chunk.source];
  const size_t source = chunk.source;
  const bool orphan = chunk.orphaned;
  if (!orphan && src.in_flight > 0) {
    --src.in_flight;
    --job.nodes[src.node].in_flight;
  }
  DropChunk(job, c, !job.finishing);
  if (!orphan && !job.finishing) {
    Status why = reply_error != 0 ? Error(reply_error, Describe(src.address) + " answered " +
                                                           ErrnoName(reply_error) + " for " +
                                                           job.request.object.ToString() + " [" +
                                                           std::to_string(chunk.offset) + ", +" +
                                                           std::to_string(chunk.size) + ")")
                                  : UcsError("receive from " + Describe(src.address), status);
    SourceFailed(job, source, why);
  }
  Schedule(job);
}

void UcxClient::ConnectionFailed(uint64_t conn, ucs_status_t status) {
  auto it = connections_.find(conn);
  if (it == connections_.end()) return;  // closed already
  auto job = jobs_.find(it->second.job);
  if (job == jobs_.end()) return;
  Job::Source& src = job->second->sources[it->second.source];
  SourceFailed(*job->second, it->second.source, UcsError(Describe(src.address), status));
}

void UcxClient::Arrived(Job& job, size_t c) {
  Job::Chunk& chunk = job.chunks[c];
  Job::Source& src = job.sources[chunk.source];
  Job::Node& node = job.nodes[src.node];
  if (!chunk.orphaned && src.in_flight > 0) {
    --src.in_flight;
    --node.in_flight;
  }
  src.bytes += chunk.size;
  src.last_progress = Clock::now();
  const auto took = src.last_progress - chunk.requested;
  if (took * 2 >= job.options.stall_timeout) {
    node.window = 1;
  } else if (took * 4 < job.options.stall_timeout) {
    node.window = std::min(node.window + 1, job.options.window * lanes_.size());
  }
  if (job.finishing) {
    DropChunk(job, c, false);
    return MaybeFinish(job);
  }
  chunk.state = Job::Chunk::State::kVerifying;
  std::vector<std::pair<uint64_t, uint64_t>> ranges = job.verifier->Ranges(c);
  if (ranges.empty()) return StartLanding(job, c);  // no member in it: nothing to check
  {
    std::lock_guard lock(verify_mu_);
    verify_queue_.push_back({job.id, c, chunk.buffer, std::move(ranges)});
  }
  verify_cv_.notify_one();
  Schedule(job);
}

void UcxClient::Verified(uint64_t job_id, size_t c, const std::vector<uint32_t>& crcs) {
  auto jit = jobs_.find(job_id);
  if (jit == jobs_.end()) return;
  Job& job = *jit->second;
  Job::Chunk& chunk = job.chunks[c];
  if (chunk.state != Job::Chunk::State::kVerifying) return;
  if (job.finishing) {
    DropChunk(job, c, false);
    return MaybeFinish(job);
  }
  if (Status st = job.verifier->Record(c, crcs); !st.ok()) {
    const Job::Source& src = job.sources[chunk.source];
    DropChunk(job, c, false);
    return FailJob(job, st.Prepend("fetch " + job.request.object.ToString() + " from " +
                                   Describe(src.address)));
  }
  StartLanding(job, c);
}

void UcxClient::StartLanding(Job& job, size_t c) {
  Job::Chunk& chunk = job.chunks[c];
  chunk.state = Job::Chunk::State::kLanding;
  const uint64_t id = job.id;
  const std::thread::id loop_thread = std::this_thread::get_id();
  std::shared_ptr<Mailbox> mailbox = mailbox_;
  job.sink->Land(chunk.offset, chunk.buffer, [this, id, c, loop_thread, mailbox](Status st) {
    if (std::this_thread::get_id() == loop_thread) {
      landed_.push_back({id, c, std::move(st)});
      return;
    }
    // From the sink's own thread: `this` is only touched on the loop, and
    // only while the client lives (the mailbox says).
    mailbox->Post([this, id, c, st = std::move(st)] { landed_.push_back({id, c, st}); });
  });
  Schedule(job);
}

void UcxClient::LandDone(uint64_t job_id, size_t c, const Status& status) {
  auto jit = jobs_.find(job_id);
  if (jit == jobs_.end()) return;
  Job& job = *jit->second;
  Job::Chunk& chunk = job.chunks[c];
  if (chunk.state != Job::Chunk::State::kLanding) return;
  chunk.state = Job::Chunk::State::kDone;
  chunk.buffer = {};
  --job.out;
  ++job.done;
  job.progress->bytes += chunk.size;
  if (!status.ok()) return FailJob(job, status.Prepend("fetch sink"));
  Schedule(job);
}

void UcxClient::CloseConnection(Job& job, size_t i, bool force) {
  Job::Source& src = job.sources[i];
  if (src.conn == 0) return;
  connections_.erase(src.conn);
  lanes_[src.lane]->Close(src.conn, force);
  src.conn = 0;
}

void UcxClient::DropChunk(Job& job, size_t c, bool requeue) {
  Job::Chunk& chunk = job.chunks[c];
  in_flight_.erase(chunk.request_id);
  job.sink->Drop(chunk.offset, chunk.buffer);
  chunk.buffer = {};
  chunk.state = Job::Chunk::State::kQueued;
  chunk.orphaned = false;
  --job.out;
  if (requeue) {
    job.queue.push_front(c);
    ++job.requeued;
  }
}

void UcxClient::SourceFailed(Job& job, size_t i, const Status& why) {
  // A source fails as a whole: its other connections share the link and
  // the process that failed this one, and a chunk requeued onto them would
  // wait out the stall timeout once more for each.
  if (job.sources[i].failed() || job.ended) return;
  const Status failure = why.ok() ? Error(EIO, "source failed") : why;
  const size_t node = job.sources[i].node;
  size_t moved = 0;
  for (size_t k = 0; k < job.sources.size(); ++k) {
    Job::Source& src = job.sources[k];
    if (src.node != node || src.failed()) continue;
    src.failure = failure;
    CloseConnection(job, k, true);  // its lane cancels its requests in flight
    for (Job::Chunk& chunk : job.chunks) {
      if (chunk.source != k || chunk.state != Job::Chunk::State::kRequested || chunk.orphaned)
        continue;
      chunk.orphaned = true;  // back to the queue when the lane gives its buffer back
      ++moved;
    }
    src.in_flight = 0;
  }
  job.nodes[node].in_flight = 0;
  GPUFS_LOG(WARN) << "fetch " << job.request.object.ToString() << ": dropping source "
                  << Describe(job.sources[i].address) << ": " << failure.ToString() << "; " << moved
                  << " ranges in flight go to the other sources";
  Schedule(job);
}

void UcxClient::FailJob(Job& job, const Status& why) {
  if (job.ended) return;
  if (job.status.ok()) {
    job.status = why.ok() ? Error(EIO, "fetch failed") : why;
    GPUFS_LOG(WARN) << job.status.ToString();
  }
  job.finishing = true;
  job.queue.clear();
  // The lanes cancel the requests in flight and give their buffers back.
  for (size_t i = 0; i < job.sources.size(); ++i) CloseConnection(job, i, true);
  MaybeFinish(job);
}

void UcxClient::MaybeFinish(Job& job) {
  if (job.ended) return;
  const bool all_done = job.done == job.chunks.size();
  if (!job.finishing && !all_done) return;
  if (job.requested > 0 || job.out > 0) return;  // lanes or the sink still hold buffers
  job.ended = true;
  if (job.status.ok() && !job.verifier->AllVerified())
    job.status = Error(EIO, "fetch " + job.request.object.ToString() + ": segments left unchecked");
  const double seconds = std::chrono::duration<double>(Clock::now() - job.start).count();
  for (size_t i = 0; i < job.sources.size(); ++i) CloseConnection(job, i, false);
  if (job.status.ok()) {
    FetchResult r;
    r.bytes = job.request.size;
    r.seconds = seconds;
    r.requeued_chunks = job.requeued;
    // By source: its connections' bytes.
    for (const SourceAddress& a : job.request.sources) r.sources.push_back({a.node, 0, Status()});
    std::vector<size_t> alive(job.request.sources.size(), 0);
    for (const Job::Source& s : job.sources) {
      r.sources[s.node].bytes += s.bytes;
      if (s.bytes > 0) ++r.sources[s.node].connections;
      if (!s.failed())
        ++alive[s.node];
      else if (r.sources[s.node].failure.ok())
        r.sources[s.node].failure = s.failure;
    }
    for (size_t n = 0; n < alive.size(); ++n)
      if (alive[n] > 0) r.sources[n].failure = Status();
    GPUFS_LOG(INFO) << "fetched " << job.request.object.ToString() << ": " << r.bytes
                    << " bytes in " << seconds << " s ("
                    << (seconds > 0 ? r.bytes / seconds / 1e6 : 0) << " MB/s) from "
                    << job.request.sources.size() << " sources over " << lanes_.size()
                    << (lanes_.size() == 1 ? " lane" : " lanes");
    job.promise.set_value(std::move(r));
  } else {
    job.promise.set_value(job.status);
  }
  {
    std::lock_guard lock(stats_mu_);
    progress_.erase(job.id);
  }
  ended_.push_back(job.id);
}

}  // namespace gpufs::cluster
