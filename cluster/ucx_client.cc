#include "cluster/ucx_client.h"

#include <cstring>

#include "cluster/ucx_client_internal.h"
#include "util/log.h"

namespace gpufs::cluster {

Result<std::unique_ptr<UcxClient>> UcxClient::Start(ucp_context_h context, size_t lanes) {
  if (lanes == 0 || lanes > kMaxLanes)
    return Error(EINVAL, "UCX client: lanes must be 1 to " + std::to_string(kMaxLanes));
  GPUFS_ASSIGN_OR_RETURN(auto loop, UcxWorkerLoop::Create(context, "ucx fetch"));
  std::unique_ptr<UcxClient> c(new UcxClient(std::move(loop)));
  c->loop_->set_tick([raw = c.get()] { return raw->Tick(); });
  c->verify_thread_ = std::thread([raw = c.get()] { raw->VerifyThread(); });
  c->loop_->Start();
  // The lanes report to the loop through the mailbox, so a report that
  // comes after the client stopped is dropped.
  std::shared_ptr<Mailbox> mailbox = c->mailbox_;
  UcxClient* raw = c.get();
  UcxClientLane::Events events;
  events.done = [mailbox, raw](uint64_t id, ucs_status_t st, int reply_error) {
    mailbox->Post([raw, id, st, reply_error] { raw->RequestDone(id, st, reply_error); });
  };
  events.failed = [mailbox, raw](uint64_t conn, ucs_status_t st) {
    mailbox->Post([raw, conn, st] { raw->ConnectionFailed(conn, st); });
  };
  for (size_t i = 0; i < lanes; ++i) {
    GPUFS_ASSIGN_OR_RETURN(
        auto lane, UcxClientLane::Start(context, "ucx client " + std::to_string(i), events));
    c->lanes_.push_back(std::move(lane));
  }
  return c;
}

UcxClient::UcxClient(std::unique_ptr<UcxWorkerLoop> loop)
    : loop_(std::move(loop)), mailbox_(std::make_shared<Mailbox>()) {
  mailbox_->loop = loop_.get();
}

UcxClient::~UcxClient() {
  // Fail what is in flight (its connections closed with force, which
  // cancels their receives), then stop the lanes: each gives back every
  // buffer it held, reporting to the loop, which still runs. Only then the
  // loop.
  std::promise<void> failed;
  std::future<void> failed_done = failed.get_future();
  if (loop_->Post([this, &failed] {
        stopping_ = true;
        FailAll();
        failed.set_value();
      }))
    failed_done.wait();
  for (auto& lane : lanes_) lane->Stop();
  {
    std::lock_guard lock(mailbox_->mu);
    mailbox_->loop = nullptr;
  }
  loop_->Stop([this] { Shutdown(); });
}

void UcxClient::FailAll() {
  std::vector<uint64_t> ids;
  for (auto& [id, job] : jobs_) ids.push_back(id);
  for (uint64_t id : ids) {
    auto it = jobs_.find(id);
    if (it != jobs_.end())
      FailJob(*it->second, Error(ECANCELED, "the UCX client is shutting down"));
  }
}

void UcxClient::Shutdown() {
  // The lanes have given every buffer back. Sinks' done() calls can no
  // longer arrive (the mailbox is shut), so a chunk still landing counts as
  // given back now. The verify thread finishes the chunk it is reading and
  // stops first.
  stopping_ = true;
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
  FailAll();
  for (auto& [id, job] : jobs_) {
    if (job->ended) continue;
    if (job->requested > 0)
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
  job->path = std::make_shared<const std::string>(request.object.path);
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

}  // namespace gpufs::cluster
