#include "cluster/ucx_server_lane.h"

#include <cstring>

#include "util/log.h"

namespace gpufs::cluster {

// What a reply's send needs until UCX completes it: the header (UCX may
// read it late), the source kept alive, the staging slot to free or the
// in-place range's hold (released before the source).
struct UcxServer::Lane::SendContext {
  Lane* lane;
  ReadReply header;
  std::shared_ptr<const ByteSource> keep;
  ssize_t slot;  // -1: none
  std::shared_ptr<const void> hold;
};

UcxServer::Lane::Lane(const ServerOptions& options, const SourceProvider& provider,
                      Counters& counters, std::unique_ptr<UcxWorkerLoop> loop)
    : options_(options), provider_(provider), counters_(counters), loop_(std::move(loop)) {}

UcxServer::Lane::~Lane() { Stop(); }

Status UcxServer::Lane::Start() {
  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  am.id = kReadRequestId;
  am.cb = &Lane::OnRequest;
  am.arg = this;
  am.flags = UCP_AM_FLAG_WHOLE_MSG;
  ucs_status_t st = ucp_worker_set_am_recv_handler(loop_->worker(), &am);
  if (st != UCS_OK) return UcsError("ucp_worker_set_am_recv_handler", st);
  staging_.resize(std::max<size_t>(options_.staging_buffers, 2));
  copy_thread_ = std::thread([this] { CopyThread(); });
  loop_->set_tick([this] { return Tick(); });
  loop_->Start();
  return Status();
}

void UcxServer::Lane::Stop(std::function<void()> before) {
  if (stopped_) return;
  stopped_ = true;
  loop_->Stop([this, before = std::move(before)] {
    if (before) before();
    Shutdown();
  });
  {
    std::lock_guard lock(copy_mu_);
    copy_stop_ = true;
  }
  copy_cv_.notify_all();
  if (copy_thread_.joinable()) copy_thread_.join();
  for (Staging& s : staging_)
    if (s.data != nullptr) options_.allocator.release(s.data, s.size);
  staging_.clear();
}

void UcxServer::Lane::Shutdown() {
  shutting_down_ = true;
  std::vector<ucp_ep_h> eps(endpoints_.begin(), endpoints_.end());
  for (ucp_ep_h ep : to_close_) eps.push_back(ep);
  to_close_.clear();
  for (ucp_ep_h ep : eps) CloseEndpoint(ep, true);
  endpoints_.clear();
  if (!loop_->ProgressUntil([this] { return closing_ == 0; }, std::chrono::seconds(2)))
    GPUFS_LOG(WARN) << "UCX server: " << closing_ << " endpoints still closing at shutdown";
}

ucs_status_t UcxServer::Lane::OnRequest(void* arg, const void* header, size_t header_length,
                                        void* data, size_t length,
                                        const ucp_am_recv_param_t* param) {
  auto* s = static_cast<Lane*>(arg);
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep == nullptr) {
    ++s->counters_.refused;
    return UCS_OK;  // nobody to answer
  }
  Pending p{param->reply_ep, {}, {}, 0};
  if (header_length != sizeof(ReadRequest)) {
    p.error = EPROTO;
  } else {
    std::memcpy(&p.request, header, sizeof p.request);
    if (p.request.magic != kWireMagic) p.error = EPROTO;
  }
  if (p.error == 0) {
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length > kMaxPathBytes)
      p.error = ENAMETOOLONG;  // the descriptor is dropped when we return
    else
      p.path.assign(static_cast<const char*>(data), length);
  }
  s->pending_.push_back(std::move(p));
  return UCS_OK;
}

void UcxServer::Lane::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* s = static_cast<Lane*>(arg);
  if (s->endpoints_.erase(ep) == 0) return;
  --s->counters_.connections_now;
  GPUFS_LOG(INFO) << "UCX server: a peer went away (" << ucs_status_string(status) << ")";
  s->to_close_.push_back(ep);
}

UcxWorkerLoop::Clock::time_point UcxServer::Lane::Tick() {
  std::vector<Pending> pending;
  pending.swap(pending_);
  for (Pending& p : pending) Serve(p);
  std::vector<ucp_ep_h> closing;
  closing.swap(to_close_);
  for (ucp_ep_h ep : closing) CloseEndpoint(ep, false);
  return UcxWorkerLoop::Clock::time_point::max();
}

void UcxServer::Lane::Accept(ucp_conn_request_h request) {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.conn_request = request;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxServer::Lane::OnEndpointError;
  ep.err_handler.arg = this;
  ucp_ep_h handle = nullptr;  // on this lane's worker, whichever lane listens
  ucs_status_t st = ucp_ep_create(loop_->worker(), &ep, &handle);
  if (st != UCS_OK) {
    GPUFS_LOG(WARN) << UcsError("UCX server: accept", st).ToString();
    return;
  }
  endpoints_.insert(handle);
  ++counters_.connections_total;
  ++counters_.connections_now;
}

void UcxServer::Lane::CloseEndpoint(ucp_ep_h ep, bool count_pending) {
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  p.user_data = count_pending ? this : nullptr;
  p.cb.send = [](void* request, ucs_status_t, void* user) {
    if (user != nullptr) --static_cast<Lane*>(user)->closing_;
    ucp_request_free(request);
  };
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(r) && count_pending) ++closing_;
}

void UcxServer::Lane::Serve(Pending& p) {
  ++counters_.requests;
  if (p.error != 0) return Reply(p.ep, p.request, p.error, nullptr, nullptr, -1);
  const ReadRequest& r = p.request;
  std::shared_ptr<const ByteSource> source = provider_(ObjectRef{p.path, r.version});
  int error = 0;
  if (!source)
    error = ENOENT;
  else if (r.offset > source->size() || r.length > source->size() - r.offset)
    error = ERANGE;
  else if (r.length > options_.max_request_bytes)
    error = EMSGSIZE;
  if (error != 0) {
    GPUFS_LOG(DEBUG) << "UCX server: " << p.path << "@" << r.version << " [" << r.offset << ", +"
                     << r.length << "): " << ErrnoName(error);
    return Reply(p.ep, r, error, nullptr, nullptr, -1);
  }
  if (const std::byte* host = source->host_data())
    return Reply(p.ep, r, 0, host + r.offset, std::move(source), -1);
  if (std::optional<ByteSource::InPlaceRange> range = source->InPlace(r.offset, r.length)) {
    if (range->bytes.size() == r.length) {
      ++counters_.in_place;
      return Reply(p.ep, r, 0, range->bytes.data(), std::move(source), -1, std::move(range->hold));
    }
  }
  waiting_for_staging_.push_back(CopyJob{p.ep, r, std::move(source), 0});
  StartCopies();
}

void UcxServer::Lane::StartCopies() {
  while (!shutting_down_ && !waiting_for_staging_.empty()) {
    size_t slot = 0;
    while (slot < staging_.size() && staging_[slot].busy) ++slot;
    if (slot == staging_.size()) return;  // all busy: the next SendDone starts one
    CopyJob job = std::move(waiting_for_staging_.front());
    waiting_for_staging_.pop_front();
    Staging& st = staging_[slot];
    if (st.size < job.request.length) {
      if (st.data != nullptr) options_.allocator.release(st.data, st.size);
      st.size = std::max<size_t>(job.request.length, 1 << 20);
      st.data = static_cast<std::byte*>(options_.allocator.allocate(st.size));
      if (st.data == nullptr) {
        st.size = 0;
        Reply(job.ep, job.request, ENOMEM, nullptr, nullptr, -1);
        continue;
      }
    }
    st.busy = true;
    job.slot = slot;
    {
      std::lock_guard lock(copy_mu_);
      copy_queue_.push_back(std::move(job));
    }
    copy_cv_.notify_one();
  }
}

void UcxServer::Lane::CopyThread() {
  for (;;) {
    CopyJob job;
    {
      std::unique_lock lock(copy_mu_);
      copy_cv_.wait(lock, [&] { return copy_stop_ || !copy_queue_.empty(); });
      if (copy_stop_) return;
      job = std::move(copy_queue_.front());
      copy_queue_.pop_front();
    }
    // The slot is busy, so the loop thread leaves its buffer alone.
    std::span<std::byte> dst(staging_[job.slot].data, job.request.length);
    Status st = job.source->CopyOut(job.request.offset, dst);
    if (st.ok())
      ++counters_.copied;
    else
      GPUFS_LOG(WARN) << "UCX server: copy-out: " << st.ToString();
    loop_->Post([this, job = std::move(job), code = st.code()]() mutable {
      if (code != 0) {
        staging_[job.slot].busy = false;
        Reply(job.ep, job.request, code, nullptr, nullptr, -1);
        StartCopies();
        return;
      }
      Reply(job.ep, job.request, 0, staging_[job.slot].data, std::move(job.source),
            static_cast<ssize_t>(job.slot));
    });
  }
}

void UcxServer::Lane::Reply(ucp_ep_h ep, const ReadRequest& request, int error,
                            const std::byte* data, std::shared_ptr<const ByteSource> keep,
                            ssize_t slot, std::shared_ptr<const void> hold) {
  auto* ctx = new SendContext{this, ReadReply{}, std::move(keep), slot, std::move(hold)};
  ctx->header.status = error;
  ctx->header.request_id = request.request_id;
  ctx->header.offset = request.offset;
  ctx->header.length = error == 0 ? request.length : 0;
  if (error != 0) ++counters_.refused;
  if (endpoints_.count(ep) == 0) {  // the peer went away meanwhile
    SendDone(ctx, UCS_ERR_CONNECTION_RESET);
    return;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &UcxServer::Lane::OnSent;
  p.user_data = ctx;
  ucs_status_ptr_t r = ucp_am_send_nbx(ep, kReadReplyId, &ctx->header, sizeof ctx->header,
                                       error == 0 ? data : nullptr, ctx->header.length, &p);
  if (r == nullptr) {
    SendDone(ctx, UCS_OK);
  } else if (UCS_PTR_IS_ERR(r)) {
    SendDone(ctx, UCS_PTR_STATUS(r));
  }
}

void UcxServer::Lane::OnSent(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<SendContext*>(user_data);
  ctx->lane->SendDone(ctx, status);
  ucp_request_free(request);
}

void UcxServer::Lane::SendDone(SendContext* ctx, ucs_status_t status) {
  if (status == UCS_OK) {
    counters_.bytes += ctx->header.length;
    bytes_ += ctx->header.length;
  } else {
    ++counters_.failed_sends;
  }
  if (ctx->slot >= 0) staging_[static_cast<size_t>(ctx->slot)].busy = false;
  bool freed_slot = ctx->slot >= 0;
  delete ctx;
  if (freed_slot) StartCopies();
}

}  // namespace gpufs::cluster
