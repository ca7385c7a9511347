// UcxTransport: the Transport over UCX (UCP active messages): a server for
// this node's buffers (ucx_server.h) and a client for fetching others'
// (ucx_client.h), sharing one UCP context.
//
// Debian's UCX (1.13) moves host memory over TCP, shared memory and
// InfiniBand/RoCE verbs; it has no CUDA transport, so GPU buffers travel
// through the staging paths (ByteSource::CopyOut, a staging FetchSink). A
// CUDA-aware UCX could take device pointers directly: that is a ByteSource
// whose host_data() is a device pointer and a sink that hands out device
// memory, plus UCP_OP_ATTR_FIELD_MEMORY_TYPE on the sends and receives.
#pragma once

#include <memory>

#include "cluster/transport.h"
#include "cluster/ucx_client.h"
#include "cluster/ucx_server.h"
#include "cluster/ucx_util.h"

namespace gpufs::cluster {

struct UcxTransportOptions {
  UcxOptions ucx;
  // server.listen empty: fetch only, serve nothing. server.lanes is the
  // server's lane count.
  ServerOptions server;
  // The client's lanes: connections to each source, each received on a
  // thread of its own (ucx_client.h).
  size_t client_lanes = 1;
};

// Lanes for a node of this machine, at each end: one per two cores, 2 to 4
// (1 on one core). On TCP a lane's thread copies every byte it moves, and
// while one thread waits on its sockets another copies: on two cores two
// lanes fetched 7-29% faster than one (docs/BENCHMARKS.md). Past four the
// threads would only take cores from the rest of the node.
size_t DefaultLanes();

class UcxTransport : public Transport {
 public:
  static Result<std::unique_ptr<UcxTransport>> Start(UcxTransportOptions options,
                                                     SourceProvider provider);
  ~UcxTransport() override;

  std::string listen_address() const override;
  Result<FetchResult> Fetch(const FetchRequest& request, FetchSink& sink,
                            const FetchOptions& options) override;
  nlohmann::json Stats() const override;

 private:
  UcxTransport() = default;
  UcpContext context_;  // destroyed last
  std::unique_ptr<UcxServer> server_;
  std::unique_ptr<UcxClient> client_;
};

}  // namespace gpufs::cluster
