// cluster_node: a ClusterNode in a process of its own, for tests (one per
// lab namespace, as a gpufs mount would be). Prints "ready ADDRESS" once
// it has joined (or "err ERRNO message" and exits 1), then answers one line
// per command on stdin:
//
//   publish PATH SIZE SEED   -> ok VERSION        (pattern SEED, three members)
//   lookup PATH              -> ok VERSION | none
//   fetch PATH               -> ok VERSION CRC32C (of the whole fetched buffer)
//   fetchmany PATH N         -> ok SUCCEEDED TRANSPORT_FETCHES   (N threads at once)
//   status                   -> the StatusJson() line
//
// Options: --etcd URL --node NAME --listen ADDR:PORT [--tls T] [--lease-ttl S]
//          [--etcd-timeout MS] [--stall-ms MS]
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <thread>

#include "cluster/cluster_node.h"
#include "tests/cluster/pattern.h"
#include "util/crc32c.h"

namespace gpufs::cluster {
namespace {

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

std::string Err(const Status& st) { return "err " + ErrnoName(st.code()) + " " + st.message(); }

std::string Hex(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

// Three members at aligned offsets, as an object written as a whole is.
ObjectManifest PatternManifest(const std::string& path, const HostReplica& r) {
  ObjectManifest m;
  m.path = path;
  m.type_name = "Model";
  m.size = r.size();
  const uint64_t a = std::min<uint64_t>(4096, r.size()), b_at = std::min<uint64_t>(8192, r.size());
  const uint64_t b = (r.size() - b_at) / 2;
  const uint64_t c_at = std::min<uint64_t>(r.size(), (b_at + b + 4095) / 4096 * 4096);
  const uint64_t cuts[3][2] = {{0, a}, {b_at, b}, {c_at, r.size() - c_at}};
  for (int i = 0; i < 3; ++i) {
    MemberManifest mm;
    mm.name = "m" + std::to_string(i);
    mm.offset = cuts[i][0];
    mm.size = cuts[i][1];
    mm.dtype = "uint8";
    mm.shape = {static_cast<int64_t>(mm.size)};
    mm.crc32c = Crc32c(0, r.bytes().subspan(mm.offset, mm.size));
    m.members.push_back(mm);
  }
  return m;
}

ReplicaAllocator HostAllocator() {
  return [](const ObjectManifest& m) -> Result<std::shared_ptr<LocalReplica>> {
    GPUFS_ASSIGN_OR_RETURN(std::shared_ptr<HostReplica> r, HostReplica::Create(m.size));
    return std::shared_ptr<LocalReplica>(std::move(r));
  };
}

Result<std::pair<uint64_t, std::shared_ptr<const ByteSource>>> Fetch(ClusterNode& node,
                                                                     const std::string& path) {
  GPUFS_ASSIGN_OR_RETURN(std::optional<CurrentVersion> cur, node.Lookup(path));
  if (!cur || cur->removed) return Error(ENOENT, path + " is not published");
  GPUFS_ASSIGN_OR_RETURN(ObjectManifest m, node.Manifest(path, cur->version));
  GPUFS_ASSIGN_OR_RETURN(std::shared_ptr<const ByteSource> bytes,
                         node.FetchOnce(m, HostAllocator()));
  return std::make_pair(cur->version, bytes);
}

int Run(int argc, char** argv) {
  ClusterNodeOptions o;
  std::string url;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string v = i + 1 < argc ? argv[i + 1] : "";
    ++i;
    if (a == "--etcd")
      url = v;
    else if (a == "--node")
      o.node = v;
    else if (a == "--listen")
      o.listen = v;
    else if (a == "--tls")
      o.ucx.transports = v;
    else if (a == "--lease-ttl")
      o.lease_ttl = std::chrono::seconds(std::atoi(v.c_str()));
    else if (a == "--etcd-timeout")
      o.etcd_timeout = std::chrono::milliseconds(std::atoi(v.c_str()));
    else if (a == "--stall-ms")
      o.fetch.stall_timeout = std::chrono::milliseconds(std::atoi(v.c_str()));
    else
      return Say("err EINVAL unknown option " + a), 2;
  }
  Result<ClusterUrl> parsed = ParseClusterUrl(url);
  if (!parsed.ok()) return Say(Err(parsed.status())), 1;
  o.etcd = *parsed;
  Result<std::unique_ptr<ClusterNode>> started = ClusterNode::Start(o);
  if (!started.ok()) return Say(Err(started.status())), 1;
  ClusterNode& node = **started;
  Say("ready " + node.address());
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd, path;
    in >> cmd >> path;
    if (cmd == "publish") {
      uint64_t size = 0, seed = 0;
      in >> size >> seed;
      Result<std::shared_ptr<HostReplica>> r = HostReplica::Create(size);
      if (!r.ok()) {
        Say(Err(r.status()));
        continue;
      }
      testing::FillPattern(seed, 0, {const_cast<std::byte*>((*r)->host_data()), size});
      Result<uint64_t> v = node.Publish(PatternManifest(path, **r), *r);
      Say(v.ok() ? "ok " + std::to_string(*v) : Err(v.status()));
    } else if (cmd == "lookup") {
      Result<std::optional<CurrentVersion>> v = node.Lookup(path);
      Say(!v.ok()           ? Err(v.status())
          : !v->has_value() ? "none"
                            : "ok " + std::to_string((*v)->version));
    } else if (cmd == "fetch") {
      auto r = Fetch(node, path);
      if (!r.ok()) {
        Say(Err(r.status()));
        continue;
      }
      std::span<const std::byte> bytes(r->second->host_data(), r->second->size());
      Say("ok " + std::to_string(r->first) + " " + Hex(Crc32c(0, bytes)));
    } else if (cmd == "fetchmany") {
      int n = 0;
      in >> n;
      const uint64_t before = node.fetches_started();
      std::atomic<int> good{0};
      std::vector<std::thread> threads;
      for (int i = 0; i < n; ++i)
        threads.emplace_back([&] {
          if (Fetch(node, path).ok()) ++good;
        });
      for (std::thread& t : threads) t.join();
      Say("ok " + std::to_string(good.load()) + " " +
          std::to_string(node.fetches_started() - before));
    } else if (cmd == "status") {
      Say(node.StatusJson().dump());
    } else {
      Say("err EINVAL unknown command " + cmd);
    }
  }
  return 0;
}

}  // namespace
}  // namespace gpufs::cluster

int main(int argc, char** argv) { return gpufs::cluster::Run(argc, argv); }
