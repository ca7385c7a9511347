// gpufs-object-publish-bench: what the daemon spends publishing an object
// written as a whole (GPUFS_IOC_ALLOC_OBJECT, then GPUFS_IOC_SEAL_OBJECT),
// step by step, with no mount and no GPU.
//
//   build/bench/gpufs-object-publish-bench [--members 201,723] [--runs 31] [--traces]
//                                          [--new-names]
//
// The core is built as the daemon builds it (a CachingCatalog over an
// exclusive SqliteCatalog in a temporary directory, under the Namespace's
// UsageCatalog), over a host store and a "cuda:0" stand-in
// (core/device_like_store.h) that takes the objects. Each run stages a
// manifest shaped like a transformers state dict (dotted names, dtype and
// shape on every member), allocates the object, seals it in place of the
// last run's (as gpufs.save does at the same path; --new-names: under a new
// name each run, nothing replaced), then does what fs does after answering
// (checksums, reaping the replaced object) and releases the staging handle.
// While the reap runs on a thread of its own, the main thread does what the
// next save would start with (create a member, write 4 KiB: "n.create",
// "n.write"), then calls GetAttr of the root every 10 us or so until the
// reap is done; "n.wait_max" is the longest of those three kinds of call:
// about the longest stretch the reap holds the namespace lock. (When the
// reap's thread starts late, n.create waits less: it is noisy.) The step figures are the daemon's own StepTrace
// lines (GPUFS_TRACE=1, read back from the log; "r." the reap's); "parse"
// is DecodeManifest alone; "r.wall" the reap's call as the caller sees it.
// Prints, per member count, the median over the runs of each step, in ms.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/device_like_store.h"
#include "core/namespace.h"
#include "meta/caching_catalog.h"
#include "meta/sqlite_catalog.h"
#include "proto/object_manifest.h"
#include "store/host_bulk_store.h"
#include "tests/support/temp_dir.h"
#include "util/log.h"

namespace gpufs {
namespace {

// A state dict's manifest: per layer the projections, norms and biases, as
// transformers names them; each member a small float tensor (the catalog's
// work does not depend on the sizes).
std::string StateDictManifest(size_t members) {
  static const char* const kParts[] = {
      "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
      "self_attn.o_proj.weight", "mlp.gate_proj.weight",    "mlp.up_proj.weight",
      "mlp.down_proj.weight",    "input_layernorm.weight",  "post_attention_layernorm.weight"};
  proto::ObjectManifest m;
  m.type = "transformers.StateDict";
  m.fields = {{"framework", "torch"}, {"step", "100"}};
  for (size_t i = 0; i < members; ++i) {
    proto::ManifestMember one;
    const size_t layer = i / std::size(kParts);
    one.name = "model.layers." + std::to_string(layer) + "." + kParts[i % std::size(kParts)];
    const bool norm = i % std::size(kParts) >= 7;
    one.dtype = norm ? "float32" : "bfloat16";
    one.shape = norm ? std::vector<uint64_t>{1024} : std::vector<uint64_t>{16, 128};
    one.size = norm ? 4096 : 16 * 128 * 2;
    m.members.push_back(std::move(one));
  }
  return proto::EncodeManifest(m);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// "trace: WHAT: step 0.123 step 0.456 total 0.579 ms" -> {step: ms}.
std::map<std::string, double> ParseTrace(const std::string& line) {
  std::map<std::string, double> steps;
  const size_t colon = line.find(": ", line.find("trace: ") + 7);
  if (colon == std::string::npos) return steps;
  std::istringstream in(line.substr(colon + 2));
  std::string name;
  double ms = 0;
  while (in >> name >> ms) steps[name] = ms;
  return steps;
}

class Bench {
 public:
  ~Bench() {
    ns_.reset();
    if (stores_ != tmp_.path()) std::filesystem::remove_all(stores_);
  }
  bool Start() {
    auto catalog = SqliteCatalog::Open(tmp_.path() + "/catalog.db", 0, 0, 0755);
    // The stores in memory where there is a tmpfs (a GPU's memory has no
    // file system under it); the catalog on disk, as the daemon's state.
    std::string shm = "/dev/shm/gpufs-publish-bench-XXXXXX";
    stores_ = ::mkdtemp(shm.data()) != nullptr ? shm : tmp_.path();
    auto host = HostBulkStore::Open(stores_ + "/host", 1ull << 30);
    auto dev = HostBulkStore::Open(stores_ + "/dev", 1ull << 32);
    if (!catalog.ok() || !host.ok() || !dev.ok()) return false;
    auto device = std::make_unique<DeviceLikeStore>(std::move(*dev));
    device->vmm = true;
    NamespaceOptions options;
    options.catalog = std::make_unique<CachingCatalog>(std::move(*catalog));
    options.stores.push_back(std::move(*host));
    options.stores.push_back(std::move(device));
    options.default_device = TierId::Gpu(0);
    auto ns = Namespace::Open(std::move(options));
    if (!ns.ok()) {
      std::fprintf(stderr, "open: %s\n", ns.status().ToString().c_str());
      return false;
    }
    ns_ = std::move(*ns);
    return true;
  }

  // One save, `replace`-ing what is at `name`; false on a failure (printed).
  // The reap runs beside the next save's first steps, timed into `samples`.
  bool SaveOnce(const std::string& manifest, const std::string& name, bool replace,
                std::map<std::string, std::vector<double>>* samples) {
    auto h =
        ns_->Create(root_, kRootEntryId, "." + name + ".saving", 0644, O_RDWR | O_CREAT | O_EXCL);
    if (!Check(h.status(), "create")) return false;
    std::span<const std::byte> bytes{reinterpret_cast<const std::byte*>(manifest.data()),
                                     manifest.size()};
    if (!Check(ns_->Write(h->handle, 0, bytes).status(), "write manifest")) return false;
    if (!Check(ns_->AllocObject(h->handle, root_).status(), "alloc object")) return false;
    if (!Check(ns_->SealObject(h->handle, name, replace, root_), "seal object")) return false;
    ns_->SumSealed();
    if (!Reap(samples)) return false;
    return Check(ns_->Release(h->handle), "release");
  }

 private:
  using Clock = std::chrono::steady_clock;
  static double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

  // ReapReplaced on a thread, and beside it a create, a 4 KiB write and
  // GetAttr calls until it returns.
  bool Reap(std::map<std::string, std::vector<double>>* samples) {
    std::atomic<bool> started{false}, done{false};
    Clock::duration wall{};
    std::thread reaper([&] {
      started = true;
      const auto t0 = Clock::now();
      ns_->ReapReplaced();
      wall = Clock::now() - t0;
      done = true;
    });
    while (!started) std::this_thread::yield();
    // About a request's round trip through the kernel after the seal's answer.
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    const std::string probe = ".probe-" + std::to_string(probes_++);
    const auto c0 = Clock::now();
    auto h = ns_->Create(root_, kRootEntryId, probe, 0644, O_RDWR | O_CREAT | O_EXCL);
    const auto c1 = Clock::now();
    const std::vector<std::byte> page(4096, std::byte{1});
    bool ok = Check(h.status(), "probe create") &&
              Check(ns_->Write(h->handle, 0, page).status(), "probe write");
    const auto c2 = Clock::now();
    Clock::duration longest = std::max(c1 - c0, c2 - c1);
    while (ok && !done) {
      const auto g0 = Clock::now();
      ok = Check(ns_->GetAttr(kRootEntryId).status(), "probe getattr");
      longest = std::max(longest, Clock::now() - g0);
      // Not back at once: a mutex is not fair, the reap would wait for it.
      std::this_thread::sleep_for(std::chrono::microseconds(10));
    }
    reaper.join();
    if (h.ok()) ok = Check(ns_->Release(h->handle), "probe release") && ok;
    ok = ok && Check(ns_->Unlink(kRootEntryId, probe), "probe unlink");
    (*samples)["n.create"].push_back(Ms(c1 - c0));
    (*samples)["n.write"].push_back(Ms(c2 - c1));
    (*samples)["n.wait_max"].push_back(Ms(longest));
    (*samples)["r.wall"].push_back(Ms(wall));
    return ok;
  }

  static bool Check(const Status& s, const char* what) {
    if (!s.ok()) std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    return s.ok();
  }
  test_support::TempDir tmp_{"gpufs-publish-bench"};
  const Caller root_{0, 0, 1, {}};
  std::string stores_;
  std::unique_ptr<Namespace> ns_;
  uint64_t probes_ = 0;
};

int Main(int argc, char** argv) {
  std::vector<size_t> counts = {201, 723};
  int runs = 31;
  bool print_traces = false;
  bool new_names = false;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--traces") {  // the daemon's trace lines, to stderr
      print_traces = true;
      --i;
    } else if (flag == "--new-names") {  // nothing replaced, nothing reaped
      new_names = true;
      --i;
    } else if (i + 1 == argc) {
      std::fprintf(stderr, "%s needs a value\n", flag.c_str());
      return 2;
    } else if (flag == "--runs") {
      runs = std::max(1, std::atoi(argv[i + 1]));
    } else if (flag == "--members") {
      counts.clear();
      std::stringstream list(argv[i + 1]);
      for (std::string one; std::getline(list, one, ',');) counts.push_back(std::stoul(one));
    } else {
      std::fprintf(stderr, "usage: %s [--members 201,723] [--runs 31] [--traces] [--new-names]\n",
                   argv[0]);
      return 2;
    }
  }
  setenv("GPUFS_TRACE", "1", 1);  // before the first StepTrace reads it
  const int log_fd = memfd_create("gpufs-publish-bench-log", 0);
  if (log_fd < 0) return 1;
  log::SetFd(log_fd);

  // Per member count, every step's median: rows are steps, columns counts.
  std::vector<std::map<std::string, std::vector<double>>> results;
  for (size_t count : counts) {
    Bench bench;
    if (!bench.Start()) return 1;
    const std::string manifest = StateDictManifest(count);
    std::map<std::string, std::vector<double>> samples;
    for (int run = 0; run < runs + 2; ++run) {  // two warm-ups
      const auto t0 = std::chrono::steady_clock::now();
      auto parsed = proto::DecodeManifest(manifest);
      const auto t1 = std::chrono::steady_clock::now();
      if (!parsed.ok()) return 1;
      ftruncate(log_fd, 0);
      lseek(log_fd, 0, SEEK_SET);
      std::map<std::string, std::vector<double>> reap;
      const auto s0 = std::chrono::steady_clock::now();
      const std::string name = new_names ? "model-" + std::to_string(run) : "model";
      if (!bench.SaveOnce(manifest, name, /*replace=*/!new_names, &reap)) return 1;
      const auto s1 = std::chrono::steady_clock::now();
      if (run < 2) continue;
      for (auto& [step, ms] : reap) samples[step].push_back(ms.front());
      samples["parse"].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      samples["save"].push_back(std::chrono::duration<double, std::milli>(s1 - s0).count());
      std::string log(lseek(log_fd, 0, SEEK_END), '\0');
      pread(log_fd, log.data(), log.size(), 0);
      std::istringstream lines(log);
      for (std::string line; std::getline(lines, line);) {
        const char* which =
            line.find("trace: ALLOC_OBJECT") != std::string::npos           ? "a."
            : line.find("trace: SEAL_OBJECT") != std::string::npos          ? "s."
            : line.find("trace: reap a replaced object") != std::string::npos ? "r."
                                                                              : nullptr;
        if (which == nullptr) continue;
        if (print_traces) std::fprintf(stderr, "%s\n", line.c_str());
        for (const auto& [step, ms] : ParseTrace(line)) samples[which + step].push_back(ms);
      }
    }
    results.push_back(std::move(samples));
  }
  // The steps in the order a save takes them (then any the trace adds).
  std::vector<std::string> order = {"parse",      "a.checks",      "a.manifest", "a.catalog",
                                    "a.allocate", "a.hold+export", "a.total",    "s.checks",
                                    "s.seal",     "s.catalog",     "s.total",    "r.total",
                                    "r.wall",     "n.create",      "n.write",    "n.wait_max",
                                    "save"};
  for (const auto& [step, ignored] : results.front()) {
    if (std::find(order.begin(), order.end(), step) == order.end()) order.push_back(step);
  }
  std::printf("%-16s", "step (ms)");
  for (size_t count : counts) std::printf(" %9zu", count);
  std::printf("\n");
  for (const std::string& step : order) {
    std::printf("%-16s", step.c_str());
    for (auto& samples : results) std::printf(" %9.3f", Median(samples[step]));
    std::printf("\n");
  }
  std::printf(
      "(columns: members; median of %d runs; a. = ALLOC_OBJECT, s. = SEAL_OBJECT steps;"
      " r. = the reap of the object replaced, n. = calls beside it;"
      " parse = DecodeManifest alone; save = stage, alloc, seal, checksums, reap, release)\n",
      runs);
  return 0;
}

}  // namespace
}  // namespace gpufs

int main(int argc, char** argv) { return gpufs::Main(argc, argv); }
