#include "cluster/ucx_client_lane.h"

#include <cstring>

#include "util/log.h"

namespace gpufs::cluster {

Result<std::unique_ptr<UcxClientLane>> UcxClientLane::Start(ucp_context_h context, std::string name,
                                                            Events events) {
  GPUFS_ASSIGN_OR_RETURN(auto loop, UcxWorkerLoop::Create(context, std::move(name)));
  std::unique_ptr<UcxClientLane> lane(new UcxClientLane(std::move(loop), std::move(events)));
  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  am.id = kReadReplyId;
  am.cb = &UcxClientLane::OnReply;
  am.arg = lane.get();
  am.flags = UCP_AM_FLAG_WHOLE_MSG;
  ucs_status_t st = ucp_worker_set_am_recv_handler(lane->loop_->worker(), &am);
  if (st != UCS_OK) return UcsError("ucp_worker_set_am_recv_handler", st);
  lane->loop_->set_tick([raw = lane.get()] { return raw->Tick(); });
  lane->loop_->Start();
  return lane;
}

UcxClientLane::UcxClientLane(std::unique_ptr<UcxWorkerLoop> loop, Events events)
    : loop_(std::move(loop)), events_(std::move(events)) {}

UcxClientLane::~UcxClientLane() { Stop(); }

void UcxClientLane::Stop() {
  if (stopped_) return;
  stopped_ = true;
  loop_->Stop([this] { Shutdown(); });
}

void UcxClientLane::Connect(uint64_t conn, const sockaddr_storage& addr) {
  if (!loop_->Post([this, conn, addr] { DoConnect(conn, addr); }))
    events_.failed(conn, UCS_ERR_CANCELED);
}

void UcxClientLane::Request(uint64_t conn, const ReadRequest& header,
                            std::shared_ptr<const std::string> path, std::span<std::byte> buffer) {
  if (!loop_->Post([this, conn, header, path = std::move(path), buffer] {
        DoRequest(conn, header, *path, buffer);
      }))
    events_.done(header.request_id, UCS_ERR_CANCELED, 0);
}

void UcxClientLane::Close(uint64_t conn, bool force) {
  loop_->Post([this, conn, force] { DoClose(conn, force); });  // stopped: all closed already
}

void UcxClientLane::DoConnect(uint64_t conn, const sockaddr_storage& addr) {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  ep.sockaddr.addrlen = addr.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxClientLane::OnEndpointError;
  ep.err_handler.arg = this;
  ucp_ep_h handle = nullptr;
  ucs_status_t st = ucp_ep_create(loop_->worker(), &ep, &handle);
  if (st != UCS_OK) return events_.failed(conn, st);
  conns_[conn] = handle;
  by_ep_[handle] = conn;
}

void UcxClientLane::DoRequest(uint64_t conn, const ReadRequest& header, const std::string& path,
                              std::span<std::byte> buffer) {
  auto c = conns_.find(conn);
  if (c == conns_.end()) return events_.done(header.request_id, UCS_ERR_NOT_CONNECTED, 0);
  open_[header.request_id] = Open{conn, header, buffer, nullptr};

  // The header must stay valid until the send completes: it rides in the
  // request's own heap block, freed by the completion.
  struct Send {
    ReadRequest header;
    UcxClientLane* lane;
    ucp_ep_h ep;
  };
  auto* send = new Send{header, this, c->second};
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  p.user_data = send;
  p.cb.send = [](void* request, ucs_status_t status, void* user) {
    auto* s = static_cast<Send*>(user);
    if (status != UCS_OK) s->lane->endpoint_errors_.push_back({s->ep, status});
    delete s;
    ucp_request_free(request);
  };
  ucs_status_ptr_t r = ucp_am_send_nbx(c->second, kReadRequestId, &send->header,
                                       sizeof send->header, path.data(), path.size(), &p);
  if (r == nullptr) {
    delete send;
  } else if (UCS_PTR_IS_ERR(r)) {
    delete send;
    endpoint_errors_.push_back({c->second, UCS_PTR_STATUS(r)});
  }
}

void UcxClientLane::DoClose(uint64_t conn, bool force) {
  auto c = conns_.find(conn);
  if (c == conns_.end()) return;
  ucp_ep_h ep = c->second;
  conns_.erase(c);
  by_ep_.erase(ep);
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  p.user_data = this;
  p.cb.send = [](void* request, ucs_status_t, void* user) {
    --static_cast<UcxClientLane*>(user)->closing_;
    ucp_request_free(request);
  };
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(r)) ++closing_;
  // Its requests: those still waiting for a reply end now; a receive in
  // flight is cancelled and ends when UCX completes it.
  std::vector<uint64_t> waiting;
  for (auto& [id, open] : open_) {
    if (open.conn != conn) continue;
    if (open.receive != nullptr)
      ucp_request_cancel(loop_->worker(), open.receive);
    else
      waiting.push_back(id);
  }
  for (uint64_t id : waiting) Finish(id, UCS_ERR_CANCELED, 0);
}

ucs_status_t UcxClientLane::OnReply(void* arg, const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param) {
  auto* lane = static_cast<UcxClientLane*>(arg);
  ReadReply reply;
  if (header_length != sizeof reply) return UCS_OK;  // not ours: dropped
  std::memcpy(&reply, header, sizeof reply);
  auto it = lane->open_.find(reply.request_id);
  if (reply.magic != kWireMagic || it == lane->open_.end() || it->second.receive != nullptr)
    return UCS_OK;  // cancelled meanwhile, or a duplicate: dropped
  const Open& open = it->second;
  if (reply.status != 0) {
    lane->Finish(reply.request_id, UCS_OK, reply.status);
    return UCS_OK;
  }
  if (reply.offset != open.header.offset || reply.length != open.header.length ||
      length != open.header.length) {
    lane->Finish(reply.request_id, UCS_OK, EPROTO);
    return UCS_OK;
  }
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    // The bytes are still at the server: received into the buffer once
    // progress returns.
    lane->arrivals_.push_back({reply.request_id, data, length});
    return UCS_INPROGRESS;
  }
  std::memcpy(open.buffer.data(), data, length);  // eager: here, and only now
  lane->Finish(reply.request_id, UCS_OK, 0);
  return UCS_OK;
}

void UcxClientLane::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  static_cast<UcxClientLane*>(arg)->endpoint_errors_.push_back({ep, status});
}

UcxWorkerLoop::Clock::time_point UcxClientLane::Tick() {
  for (const Arrival& a : std::exchange(arrivals_, {}))
    StartReceive(a.request_id, a.desc, a.length);
  while (!completions_.empty() || !endpoint_errors_.empty()) {
    for (auto [id, st, request] : std::exchange(completions_, {})) {
      if (request != nullptr) ucp_request_free(request);
      auto it = open_.find(id);
      if (it == open_.end()) continue;
      it->second.receive = nullptr;
      --receiving_;
      Finish(id, st, 0);
    }
    for (auto [ep, st] : std::exchange(endpoint_errors_, {})) ConnectionFailed(ep, st);
  }
  return UcxWorkerLoop::Clock::time_point::max();
}

void UcxClientLane::StartReceive(uint64_t request_id, void* desc, size_t length) {
  auto it = open_.find(request_id);
  if (it == open_.end() || conns_.count(it->second.conn) == 0) {
    ucp_am_data_release(loop_->worker(), desc);  // nobody wants it any more
    if (it != open_.end()) Finish(request_id, UCS_ERR_CANCELED, 0);
    return;
  }
  struct Receive {
    UcxClientLane* lane;
    uint64_t request_id;
  };
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.user_data = new Receive{this, request_id};
  p.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user) {
    auto* r = static_cast<Receive*>(user);
    // The request is freed by Tick: until then a cancel may name it.
    r->lane->completions_.push_back({r->request_id, status, request});
    delete r;
  };
  ucs_status_ptr_t r =
      ucp_am_recv_data_nbx(loop_->worker(), desc, it->second.buffer.data(), length, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    delete static_cast<Receive*>(p.user_data);
    return Finish(request_id, r == nullptr ? UCS_OK : UCS_PTR_STATUS(r), 0);
  }
  it->second.receive = r;
  ++receiving_;
}

void UcxClientLane::Finish(uint64_t request_id, ucs_status_t status, int reply_error) {
  open_.erase(request_id);
  events_.done(request_id, status, reply_error);
}

void UcxClientLane::ConnectionFailed(ucp_ep_h ep, ucs_status_t status) {
  auto it = by_ep_.find(ep);
  if (it == by_ep_.end()) return;  // closed already
  events_.failed(it->second, status);
}

void UcxClientLane::Shutdown() {
  std::vector<uint64_t> conns;
  for (auto& [conn, ep] : conns_) conns.push_back(conn);
  for (uint64_t conn : conns) DoClose(conn, true);
  loop_->ProgressUntil(
      [this] {
        Tick();
        return receiving_ == 0 && closing_ == 0;
      },
      std::chrono::seconds(3));
  if (receiving_ > 0)
    GPUFS_LOG(ERROR) << "UCX client: " << receiving_ << " receives still outstanding at shutdown";
  std::vector<uint64_t> left;
  for (auto& [id, open] : open_) left.push_back(id);
  for (uint64_t id : left) Finish(id, UCS_ERR_CANCELED, 0);
}

}  // namespace gpufs::cluster
