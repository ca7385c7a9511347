#include "cluster/ucx_client.h"

#include <cstring>

#include "cluster/ucx_client_internal.h"
#include "util/log.h"

namespace gpufs::cluster {

Result<std::unique_ptr<UcxClient>> UcxClient::Start(ucp_context_h context) {
  GPUFS_ASSIGN_OR_RETURN(auto loop, UcxWorkerLoop::Create(context, "ucx client"));
  std::unique_ptr<UcxClient> c(new UcxClient(std::move(loop)));
  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  am.id = kReadReplyId;
  am.cb = &UcxClient::OnReply;
  am.arg = c.get();
  am.flags = UCP_AM_FLAG_WHOLE_MSG;
  ucs_status_t st = ucp_worker_set_am_recv_handler(c->loop_->worker(), &am);
  if (st != UCS_OK) return UcsError("ucp_worker_set_am_recv_handler", st);
  c->loop_->set_tick([raw = c.get()] { return raw->Tick(); });
  c->verify_thread_ = std::thread([raw = c.get()] { raw->VerifyThread(); });
  c->loop_->Start();
  return c;
}

UcxClient::UcxClient(std::unique_ptr<UcxWorkerLoop> loop)
    : loop_(std::move(loop)), mailbox_(std::make_shared<Mailbox>()) {
  mailbox_->loop = loop_.get();
}

UcxClient::~UcxClient() {
  {
    std::lock_guard lock(mailbox_->mu);
    mailbox_->loop = nullptr;
  }
  loop_->Stop([this] { Shutdown(); });
}

void UcxClient::Shutdown() {
  // Fail what is in flight; its receives are cancelled by the endpoints'
  // forced close. Sinks' done() calls can no longer arrive (the mailbox is
  // shut), so a chunk still landing counts as given back now. The verify
  // thread finishes the chunk it is reading and stops first.
  {
    std::lock_guard lock(verify_mu_);
    verify_stop_ = true;
    verify_queue_.clear();
  }
  verify_cv_.notify_all();
  if (verify_thread_.joinable()) verify_thread_.join();
  for (auto& [id, job] : jobs_)
    for (size_t c = 0; c < job->chunks.size(); ++c)
      if (job->chunks[c].state == Job::Chunk::State::kVerifying) DropChunk(*job, c, false);
  std::vector<uint64_t> ids;
  for (auto& [id, job] : jobs_) ids.push_back(id);
  for (uint64_t id : ids) {
    auto it = jobs_.find(id);
    if (it != jobs_.end())
      FailJob(*it->second, Error(ECANCELED, "the UCX client is shutting down"));
  }
  loop_->ProgressUntil(
      [this] {
        Tick();
        for (auto& [id, job] : jobs_)
          if (job->receiving > 0) return false;
        return closing_ == 0;
      },
      std::chrono::seconds(3));
  for (auto& [id, job] : jobs_) {
    if (job->ended) continue;
    if (job->receiving > 0)
      GPUFS_LOG(ERROR) << "UCX client: " << job->request.object.ToString()
                       << ": receives still outstanding at shutdown";
    job->ended = true;
    job->promise.set_value(job->status.ok() ? Error(ECANCELED, "UCX client stopped") : job->status);
  }
  jobs_.clear();
}

Result<FetchResult> UcxClient::Fetch(const FetchRequest& request, FetchSink& sink,
                                     const FetchOptions& options) {
  if (request.sources.empty())
    return Error(EINVAL, "fetch " + request.object.ToString() + ": no sources");
  if (options.chunk_bytes == 0 || options.window == 0 || sink.capacity() == 0)
    return Error(EINVAL, "fetch " + request.object.ToString() +
                             ": chunk size, window and sink capacity must be positive");
  if (request.object.path.size() > kMaxPathBytes)
    return Error(ENAMETOOLONG,
                 "fetch: object path over " + std::to_string(kMaxPathBytes) + " bytes");
  GPUFS_ASSIGN_OR_RETURN(
      SegmentVerifier verifier,
      SegmentVerifier::Create(request.size, options.chunk_bytes, request.segments));
  auto job = std::make_unique<Job>();
  job->request = request;
  job->options = options;
  job->sink = &sink;
  job->verifier.emplace(std::move(verifier));
  job->progress = std::make_shared<Progress>();
  job->progress->object = request.object.ToString();
  job->progress->size = request.size;
  job->progress->start = std::chrono::steady_clock::now();
  job->progress->sources = request.sources.size();
  std::future<Result<FetchResult>> done = job->promise.get_future();
  auto shared = std::make_shared<std::unique_ptr<Job>>(std::move(job));
  if (!loop_->Post([this, shared] { StartJob(std::move(*shared)); }))
    return Error(ECANCELED, "the UCX client is shutting down");
  // The loop always ends a job, within its timeout, or at shutdown.
  return done.get();
}

void UcxClient::VerifyThread() {
  for (;;) {
    VerifyJob v;
    {
      std::unique_lock lock(verify_mu_);
      verify_cv_.wait(lock, [&] { return verify_stop_ || !verify_queue_.empty(); });
      if (verify_stop_) return;
      v = std::move(verify_queue_.front());
      verify_queue_.pop_front();
    }
    std::vector<uint32_t> crcs = SegmentVerifier::ChecksumRanges(v.bytes, v.ranges);
    mailbox_->Post([this, job = v.job, chunk = v.chunk, crcs = std::move(crcs)] {
      Verified(job, chunk, crcs);
    });
  }
}

nlohmann::json UcxClient::Stats() const {
  nlohmann::json fetches = nlohmann::json::array();
  std::lock_guard lock(stats_mu_);
  auto now = std::chrono::steady_clock::now();
  for (const auto& [id, p] : progress_) {
    double seconds = std::chrono::duration<double>(now - p->start).count();
    uint64_t bytes = p->bytes.load();
    fetches.push_back({{"object", p->object},
                       {"bytes", bytes},
                       {"size", p->size},
                       {"sources", p->sources},
                       {"seconds", seconds},
                       {"mb_per_s", seconds > 0 ? bytes / seconds / 1e6 : 0.0}});
  }
  return fetches;
}

ucs_status_t UcxClient::OnReply(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
  auto* c = static_cast<UcxClient*>(arg);
  ReadReply reply;
  if (header_length != sizeof reply) return UCS_OK;  // not ours: dropped
  std::memcpy(&reply, header, sizeof reply);
  auto it = c->in_flight_.find(reply.request_id);
  if (reply.magic != kWireMagic || it == c->in_flight_.end()) return UCS_OK;
  auto job = c->jobs_.find(it->second.job);
  if (job == c->jobs_.end()) return UCS_OK;
  Job::Chunk& chunk = job->second->chunks[it->second.chunk];
  if (chunk.state != Job::Chunk::State::kRequested) return UCS_OK;
  if (reply.status != 0) {
    c->error_replies_.push_back({reply.request_id, reply.status});
    return UCS_OK;
  }
  if (reply.offset != chunk.offset || reply.length != chunk.size || length != chunk.size) {
    c->error_replies_.push_back({reply.request_id, EPROTO});
    return UCS_OK;
  }
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    // The bytes are still at the server: receive them into the sink's
    // buffer once progress returns.
    c->arrivals_.push_back({reply.request_id, data, length});
    return UCS_INPROGRESS;
  }
  std::memcpy(chunk.buffer.data(), data, length);  // eager: here, and only now
  c->completions_.push_back({reply.request_id, UCS_OK, nullptr});
  return UCS_OK;
}

void UcxClient::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  static_cast<UcxClient*>(arg)->endpoint_errors_.push_back({ep, status});
}

void UcxClient::CloseEndpoint(ucp_ep_h ep, bool force) {
  endpoints_.erase(ep);
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  p.user_data = this;
  p.cb.send = [](void* request, ucs_status_t, void* user) {
    --static_cast<UcxClient*>(user)->closing_;
    ucp_request_free(request);
  };
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(r)) ++closing_;
}

}  // namespace gpufs::cluster
