// UcxClient's fetch state machine (see ucx_client.h). Every function here
// runs on the loop thread. A chunk goes kQueued -> kRequested (a buffer from
// the sink, a request sent) -> kReceiving (a rendezvous receive into the
// buffer; eager replies skip it) -> kVerifying (on the verify thread) ->
// kLanding (checked, given to the sink) -> kDone (the sink gave the buffer
// back). A failed source's
// kRequested chunks go straight back to the queue; its kReceiving ones are
// orphaned and go back when UCX completes their cancelled receive (or are
// used, if the receive completed after all).
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
  for (const SourceAddress& a : job.request.sources) {
    Job::Source src;
    src.address = a;
    src.last_progress = job.start;
    job.sources.push_back(std::move(src));
  }
  for (size_t i = 0; i < job.sources.size(); ++i) {
    Job::Source& src = job.sources[i];
    Result<sockaddr_storage> addr = ParseHostPort(src.address.address);
    if (!addr.ok()) {
      src.failure = addr.status();
      GPUFS_LOG(WARN) << "fetch " << job.request.object.ToString() << ": "
                      << src.failure.ToString();
      continue;
    }
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
    ep.sockaddr.addrlen = addr->ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxClient::OnEndpointError;
    ep.err_handler.arg = this;
    ucs_status_t st = ucp_ep_create(loop_->worker(), &ep, &src.ep);
    if (st != UCS_OK) {
      src.ep = nullptr;
      src.failure = UcsError("connect to " + Describe(src.address), st);
      GPUFS_LOG(WARN) << "fetch " << job.request.object.ToString() << ": "
                      << src.failure.ToString();
      continue;
    }
    endpoints_[src.ep] = {job.id, i};
  }
  Schedule(job);
}

void UcxClient::Schedule(Job& job) {
  if (job.ended) return;
  if (job.finishing) return MaybeFinish(job);
  while (!job.queue.empty() && job.out < job.sink->capacity()) {
    size_t best = job.sources.size();
    for (size_t i = 0; i < job.sources.size(); ++i) {
      const Job::Source& s = job.sources[i];
      if (s.failed() || s.ep == nullptr || s.in_flight >= s.window) continue;
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

  // The header must stay valid until the send completes: it rides in the
  // request's own heap block, freed by the completion.
  struct Send {
    ReadRequest header;
    UcxClient* client;
    uint64_t job;
    size_t source;
  };
  auto* send = new Send{{}, this, job.id, source};
  send->header.request_id = chunk.request_id;
  send->header.version = job.request.object.version;
  send->header.offset = chunk.offset;
  send->header.length = chunk.size;
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  p.user_data = send;
  p.cb.send = [](void* request, ucs_status_t status, void* user) {
    auto* s = static_cast<Send*>(user);
    if (status != UCS_OK) {
      auto owner = s->client->jobs_.find(s->job);
      if (owner != s->client->jobs_.end())
        s->client->endpoint_errors_.push_back({owner->second->sources[s->source].ep, status});
    }
    delete s;
    ucp_request_free(request);
  };
  const std::string& path = job.request.object.path;
  ucs_status_ptr_t r = ucp_am_send_nbx(src.ep, kReadRequestId, &send->header, sizeof send->header,
                                       path.data(), path.size(), &p);
  if (r == nullptr) {
    delete send;
  } else if (UCS_PTR_IS_ERR(r)) {
    delete send;
    SourceFailed(job, source, UcsError("request to " + Describe(src.address), UCS_PTR_STATUS(r)));
  }
}

UcxWorkerLoop::Clock::time_point UcxClient::Tick() {
  // What UCX callbacks collected during progress.
  std::vector<Arrival> arrivals;
  arrivals.swap(arrivals_);
  for (const Arrival& a : arrivals) StartReceive(a.request_id, a.desc, a.length);
  while (!completions_.empty() || !error_replies_.empty() || !endpoint_errors_.empty() ||
         !landed_.empty()) {
    auto completions = std::exchange(completions_, {});
    for (auto [id, st, request] : completions) Completed(id, st, request);
    auto errors = std::exchange(error_replies_, {});
    for (auto [id, code] : errors) ErrorReply(id, code);
    auto ep_errors = std::exchange(endpoint_errors_, {});
    for (auto [ep, st] : ep_errors) {
      auto it = endpoints_.find(ep);
      if (it == endpoints_.end()) continue;  // closed already
      auto job = jobs_.find(it->second.job);
      if (job == jobs_.end()) continue;
      Job::Source& src = job->second->sources[it->second.source];
      SourceFailed(*job->second, it->second.source, UcsError(Describe(src.address), st));
    }
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

void UcxClient::StartReceive(uint64_t request_id, void* desc, size_t length) {
  auto it = in_flight_.find(request_id);
  auto job = it == in_flight_.end() ? jobs_.end() : jobs_.find(it->second.job);
  if (job == jobs_.end() || job->second->finishing ||
      job->second->chunks[it->second.chunk].state != Job::Chunk::State::kRequested) {
    ucp_am_data_release(loop_->worker(), desc);  // nobody wants it any more
    return;
  }
  Job& j = *job->second;
  Job::Chunk& chunk = j.chunks[it->second.chunk];
  struct Receive {
    UcxClient* client;
    uint64_t request_id;
  };
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.user_data = new Receive{this, request_id};
  p.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user) {
    auto* r = static_cast<Receive*>(user);
    // The request is freed by Completed: until then a cancel may name it.
    r->client->completions_.push_back({r->request_id, status, request});
    delete r;
  };
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(loop_->worker(), desc, chunk.buffer.data(), length, &p);
  chunk.state = Job::Chunk::State::kReceiving;
  ++j.receiving;
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    delete static_cast<Receive*>(p.user_data);
    Completed(request_id, r == nullptr ? UCS_OK : UCS_PTR_STATUS(r), nullptr);
  } else {
    chunk.receive = r;
  }
}

void UcxClient::Completed(uint64_t request_id, ucs_status_t status, void* request) {
  if (request != nullptr) ucp_request_free(request);
  auto it = in_flight_.find(request_id);
  if (it == in_flight_.end()) return;
  auto jit = jobs_.find(it->second.job);
  const size_t c = it->second.chunk;
  in_flight_.erase(it);
  if (jit == jobs_.end()) return;
  Job& job = *jit->second;
  Job::Chunk& chunk = job.chunks[c];
  if (chunk.state == Job::Chunk::State::kReceiving) {
    --job.receiving;
    chunk.receive = nullptr;
  }
  if (status == UCS_OK) return Arrived(job, c);
  Job::Source& src = job.sources[chunk.source];
  const bool orphan = chunk.orphaned;
  if (!orphan && src.in_flight > 0) --src.in_flight;
  DropChunk(job, c, !job.finishing);
  if (!orphan && !job.finishing)
    SourceFailed(job, chunk.source, UcsError("receive from " + Describe(src.address), status));
  Schedule(job);
}

void UcxClient::ErrorReply(uint64_t request_id, int error) {
  auto it = in_flight_.find(request_id);
  if (it == in_flight_.end()) return;
  auto jit = jobs_.find(it->second.job);
  if (jit == jobs_.end()) return;
  Job& job = *jit->second;
  const Job::Chunk& chunk = job.chunks[it->second.chunk];
  if (chunk.state != Job::Chunk::State::kRequested) return;
  const Job::Source& src = job.sources[chunk.source];
  SourceFailed(
      job, chunk.source,
      Error(error, Describe(src.address) + " answered " + ErrnoName(error) + " for " +
                       job.request.object.ToString() + " [" + std::to_string(chunk.offset) + ", +" +
                       std::to_string(chunk.size) + ")"));
}

void UcxClient::Arrived(Job& job, size_t c) {
  Job::Chunk& chunk = job.chunks[c];
  Job::Source& src = job.sources[chunk.source];
  if (!chunk.orphaned && src.in_flight > 0) --src.in_flight;
  src.bytes += chunk.size;
  src.last_progress = Clock::now();
  const auto took = src.last_progress - chunk.requested;
  if (took * 2 >= job.options.stall_timeout) {
    src.window = 1;
  } else if (took * 4 < job.options.stall_timeout) {
    src.window = std::min(src.window + 1, job.options.window);
  }
  in_flight_.erase(chunk.request_id);
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
  Job::Source& src = job.sources[i];
  if (src.failed() || job.ended) return;
  src.failure = why.ok() ? Error(EIO, "source failed") : why;
  if (src.ep != nullptr) {
    CloseEndpoint(src.ep, true);  // cancels its receives in flight
    src.ep = nullptr;
  }
  size_t moved = 0;
  for (size_t c = 0; c < job.chunks.size(); ++c) {
    Job::Chunk& chunk = job.chunks[c];
    if (chunk.source != i) continue;
    if (chunk.state == Job::Chunk::State::kRequested) {
      DropChunk(job, c, !job.finishing);
      ++moved;
    } else if (chunk.state == Job::Chunk::State::kReceiving) {
      chunk.orphaned = true;
      ++moved;
    }
  }
  src.in_flight = 0;
  GPUFS_LOG(WARN) << "fetch " << job.request.object.ToString() << ": dropping source "
                  << Describe(src.address) << ": " << src.failure.ToString() << "; " << moved
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
  for (Job::Source& src : job.sources) {
    if (src.ep == nullptr) continue;
    CloseEndpoint(src.ep, true);
    src.ep = nullptr;
  }
  for (size_t c = 0; c < job.chunks.size(); ++c) {
    Job::Chunk& chunk = job.chunks[c];
    if (chunk.state == Job::Chunk::State::kRequested) DropChunk(job, c, false);
    if (chunk.state == Job::Chunk::State::kReceiving && chunk.receive != nullptr)
      ucp_request_cancel(loop_->worker(), chunk.receive);
  }
  MaybeFinish(job);
}

void UcxClient::MaybeFinish(Job& job) {
  if (job.ended) return;
  const bool all_done = job.done == job.chunks.size();
  if (!job.finishing && !all_done) return;
  if (job.receiving > 0 || job.out > 0) return;  // UCX or the sink still hold buffers
  job.ended = true;
  if (job.status.ok() && !job.verifier->AllVerified())
    job.status = Error(EIO, "fetch " + job.request.object.ToString() + ": segments left unchecked");
  const double seconds = std::chrono::duration<double>(Clock::now() - job.start).count();
  for (Job::Source& src : job.sources) {
    if (src.ep == nullptr) continue;
    CloseEndpoint(src.ep, false);
    src.ep = nullptr;
  }
  if (job.status.ok()) {
    FetchResult r;
    r.bytes = job.request.size;
    r.seconds = seconds;
    r.requeued_chunks = job.requeued;
    for (const Job::Source& s : job.sources)
      r.sources.push_back({s.address.node, s.bytes, s.failure});
    GPUFS_LOG(INFO) << "fetched " << job.request.object.ToString() << ": " << r.bytes
                    << " bytes in " << seconds << " s ("
                    << (seconds > 0 ? r.bytes / seconds / 1e6 : 0) << " MB/s) from "
                    << job.sources.size() << " sources";
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
