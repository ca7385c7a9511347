#include "cluster/ucx_transport.h"

#include <algorithm>
#include <thread>

namespace gpufs::cluster {

size_t DefaultLanes() {
  const size_t cores = std::thread::hardware_concurrency();
  if (cores <= 1) return 1;
  return std::clamp<size_t>(cores / 2, 2, 4);
}

Result<std::unique_ptr<UcxTransport>> UcxTransport::Start(UcxTransportOptions options,
                                                          SourceProvider provider) {
  std::unique_ptr<UcxTransport> t(new UcxTransport());
  GPUFS_ASSIGN_OR_RETURN(t->context_, CreateUcpContext(options.ucx));
  if (!options.server.listen.empty()) {
    GPUFS_ASSIGN_OR_RETURN(
        t->server_,
        UcxServer::Start(t->context_.get(), std::move(options.server), std::move(provider)));
  }
  GPUFS_ASSIGN_OR_RETURN(t->client_, UcxClient::Start(t->context_.get(), options.client_lanes));
  return t;
}

UcxTransport::~UcxTransport() {
  client_.reset();
  server_.reset();
}

std::string UcxTransport::listen_address() const { return server_ ? server_->address() : ""; }

Result<FetchResult> UcxTransport::Fetch(const FetchRequest& request, FetchSink& sink,
                                        const FetchOptions& options) {
  return client_->Fetch(request, sink, options);
}

nlohmann::json UcxTransport::Stats() const {
  return {{"server", server_ ? server_->Stats() : nlohmann::json(nullptr)},
          {"fetches", client_->Stats()}};
}

}  // namespace gpufs::cluster
