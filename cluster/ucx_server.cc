#include "cluster/ucx_server.h"

#include "cluster/ucx_server_lane.h"
#include "util/log.h"

namespace gpufs::cluster {

Result<std::unique_ptr<UcxServer>> UcxServer::Start(ucp_context_h context, ServerOptions options,
                                                    SourceProvider provider) {
  GPUFS_ASSIGN_OR_RETURN(sockaddr_storage addr, ParseHostPort(options.listen));
  if (!provider) return Error(EINVAL, "UCX server: no source provider");
  if (options.lanes == 0 || options.lanes > kMaxLanes)
    return Error(EINVAL, "UCX server: lanes must be 1 to " + std::to_string(kMaxLanes));
  std::unique_ptr<UcxServer> s(new UcxServer(std::move(options), std::move(provider)));
  for (size_t i = 0; i < s->options_.lanes; ++i) {
    GPUFS_ASSIGN_OR_RETURN(auto loop,
                           UcxWorkerLoop::Create(context, "ucx server " + std::to_string(i)));
    s->lanes_.push_back(
        std::make_unique<Lane>(s->options_, s->provider_, s->counters_, std::move(loop)));
  }

  // The listener is created before the first lane's thread starts, so it
  // is touched on that thread only from then on.
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  lp.sockaddr.addrlen = addr.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  lp.conn_handler.cb = &UcxServer::OnConnection;
  lp.conn_handler.arg = s.get();
  ucs_status_t st = ucp_listener_create(s->lanes_[0]->loop().worker(), &lp, &s->listener_);
  if (st != UCS_OK) {
    s->listener_ = nullptr;
    Status err = UcsError("UCX listen on " + s->options_.listen, st);
    if (st == UCS_ERR_BUSY) err = Error(EADDRINUSE, err.message());
    GPUFS_LOG(WARN) << err.ToString();
    return err;
  }
  ucp_listener_attr_t la{};
  la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  st = ucp_listener_query(s->listener_, &la);
  if (st != UCS_OK) return UcsError("ucp_listener_query", st);
  std::string bound = FormatSockaddr(la.sockaddr);
  const std::string& asked = s->options_.listen;
  s->address_ = asked.substr(0, asked.rfind(':')) + bound.substr(bound.rfind(':'));

  for (auto& lane : s->lanes_) GPUFS_RETURN_IF_ERROR(lane->Start());
  GPUFS_LOG(INFO) << "UCX server listening on " << s->address_ << " (" << s->lanes_.size()
                  << (s->lanes_.size() == 1 ? " lane)" : " lanes)");
  return s;
}

UcxServer::UcxServer(ServerOptions options, SourceProvider provider)
    : options_(std::move(options)), provider_(std::move(provider)) {}

UcxServer::~UcxServer() {
  // The listening lane first: no connection is handed to a lane after it.
  if (!lanes_.empty()) {
    lanes_[0]->Stop([this] {
      if (listener_ != nullptr) ucp_listener_destroy(listener_);
      listener_ = nullptr;
    });
  }
  if (listener_ != nullptr) ucp_listener_destroy(listener_);  // Start failed before the loop ran
  for (auto& lane : lanes_) lane->Stop();
}

void UcxServer::OnConnection(ucp_conn_request_h request, void* arg) {
  // On the first lane's thread, inside its progress: the request goes to
  // the next lane in turn, which accepts it on its own worker once its
  // loop runs posted work (the first lane's too: after progress returns).
  auto* s = static_cast<UcxServer*>(arg);
  Lane* lane = s->lanes_[s->next_lane_++ % s->lanes_.size()].get();
  if (!lane->loop().Post([lane, request] { lane->Accept(request); }))
    ucp_listener_reject(s->listener_, request);  // that lane is stopping
}

nlohmann::json UcxServer::Stats() const {
  const Counters& c = counters_;
  nlohmann::json lanes = nlohmann::json::array();
  for (const auto& lane : lanes_) lanes.push_back({{"bytes_served", lane->bytes_served()}});
  return {{"address", address_},
          {"lanes", lanes},
          {"requests", c.requests.load()},
          {"bytes_served", c.bytes.load()},
          {"refused", c.refused.load()},
          {"failed_sends", c.failed_sends.load()},
          {"copied_out", c.copied.load()},
          {"sent_in_place", c.in_place.load()},
          {"connections", c.connections_now.load()},
          {"connections_total", c.connections_total.load()}};
}

}  // namespace gpufs::cluster
