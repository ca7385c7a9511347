#include "cluster/cluster_objects.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "cluster/object_bytes.h"
#include "util/file_io.h"
#include "util/log.h"
#include "util/unique_fd.h"

namespace gpufs::cluster {
namespace {

using nlohmann::json;

constexpr int kPublishTries = 5;  // a publish that loses a race (EBUSY) tries again

std::string_view BaseName(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

Result<std::unique_ptr<ClusterObjects>> ClusterObjects::Start(Namespace& ns,
                                                              ClusterNodeOptions options,
                                                              std::string replicas_file) {
  std::unique_ptr<ClusterObjects> c(new ClusterObjects(ns));
  c->replicas_file_ = std::move(replicas_file);
  ClusterObjects* raw = c.get();
  options.on_change = [raw](const std::string& path) { raw->Changed(path); };
  // Registered again (or at last): every replica kept is checked anew.
  options.on_rejoined = [raw] { raw->Changed(""); };
  c->options_ = options;
  c->worker_ = std::thread([raw] { raw->Work(); });
  auto node = ClusterNode::Start(std::move(options));
  if (!node.ok()) return node.status();  // the destructor stops the worker
  {
    std::lock_guard lock(c->mu_);
    c->node_ = std::move(*node);
    c->started_ = true;
  }
  c->LoadReplicas();
  c->cv_.notify_all();
  GPUFS_LOG(INFO) << "cluster node " << c->node_->name()
                  << (c->node_->registry().alive() ? " joined "
                                                   : " started (joins when etcd answers) in ")
                  << c->options_.etcd.cluster << ", serving on " << c->node_->address();
  return c;
}

ClusterObjects::~ClusterObjects() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  node_.reset();  // leaves: this node's replicas go from etcd; then nothing is served
}

Result<std::optional<CurrentVersion>> ClusterObjects::Current(const std::string& path) {
  // With the watch away the cache may be stale and etcd slow to answer:
  // only what is known.
  if (!node_->registry().watching()) return node_->registry().CachedCurrent(path);
  return node_->Lookup(path);
}

RemoteObject ClusterObjects::ToRemote(const ObjectManifest& m) const {
  RemoteObject r;
  r.path = m.path;
  r.version = m.version;
  r.mode = m.mode;
  r.uid = m.uid;
  r.gid = m.gid;
  r.mtime_ns = m.published_ms * 1000000;
  r.bytes = m.size;
  return r;
}

std::optional<RemoteObject> ClusterObjects::Find(const std::string& path) {
  if (CheckObjectPath(path).ok() == false) return std::nullopt;
  auto current = Current(path);
  if (!current.ok()) {
    GPUFS_LOG(WARN) << "cluster lookup " << path << ": " << current.status().ToString();
    return std::nullopt;
  }
  if (!*current || (*current)->removed) return std::nullopt;
  auto manifest = node_->Manifest(path, (*current)->version);
  if (!manifest.ok()) {
    GPUFS_LOG(WARN) << "cluster lookup " << path << ": " << manifest.status().ToString();
    return std::nullopt;
  }
  return ToRemote(*manifest);
}

std::vector<RemoteObject> ClusterObjects::List(const std::string& dir) {
  std::vector<RemoteObject> out;
  if (!node_->registry().watching()) return out;
  auto listed = node_->List(dir);
  if (!listed.ok()) {
    GPUFS_LOG(WARN) << "cluster list /" << dir << ": " << listed.status().ToString();
    return out;
  }
  const std::string prefix = dir.empty() ? dir : dir + "/";
  for (const auto& [path, current] : *listed) {
    if (current.removed || !path.starts_with(prefix)) continue;
    if (path.find('/', prefix.size()) != std::string::npos) continue;  // deeper
    auto manifest = node_->Manifest(path, current.version);
    if (!manifest.ok()) {
      GPUFS_LOG(WARN) << "cluster list " << path << ": " << manifest.status().ToString();
      continue;
    }
    out.push_back(ToRemote(*manifest));
  }
  return out;
}

Result<bool> ClusterObjects::FetchOnce(const ObjectManifest& manifest) {
  const uint64_t chunk = options_.fetch.chunk_bytes;
  const StagingAllocator staging = options_.staging;
  const size_t lanes = options_.lanes;
  Namespace& ns = ns_;
  uint64_t object = 0;
  auto fetched = node_->FetchOnce(
      manifest, [&](const ObjectManifest& m) -> Result<std::shared_ptr<LocalReplica>> {
        GPUFS_ASSIGN_OR_RETURN(auto replica,
                               NamespaceReplica::Create(ns, m, chunk, staging, lanes));
        return std::shared_ptr<LocalReplica>(replica);
      });
  if (!fetched.ok()) return fetched.status();
  if (auto* replica = dynamic_cast<const NamespaceReplica*>(fetched->get())) object = replica->object();
  if (object == 0) return false;
  {
    std::lock_guard lock(mu_);
    fetched_[manifest.path] = {manifest.version, object, true};
  }
  SaveReplicas();
  return true;
}

Status ClusterObjects::Fetch(const RemoteObject& object) {
  ++fetch_requests_;
  Status st = [&]() -> Status {
    GPUFS_ASSIGN_OR_RETURN(ObjectManifest manifest, node_->Manifest(object.path, object.version));
    for (int attempt = 0;; ++attempt) {
      GPUFS_ASSIGN_OR_RETURN(bool ours, FetchOnce(manifest));
      auto local = LookupPath(ns_, object.path);
      if (local.ok() && !Namespace::IsRemoteIno(local->ino)) return Status::Ok();
      // A replica served still, whose local copy was removed here: fetched again.
      if (!ours || attempt > 0) {
        return Error(ENOENT, "/" + object.path + ": the local copy of the replica was removed");
      }
      {
        std::lock_guard lock(mu_);
        fetched_.erase(object.path);
      }
      SaveReplicas();
      (void)node_->DropReplica(object.path, object.version);
    }
  }();
  if (st.ok()) {
    ++fetches_done_;
    fetched_bytes_ += object.bytes;
  } else {
    ++fetches_failed_;
    GPUFS_LOG(WARN) << "cluster fetch " << object.path << "@" << object.version << ": "
                    << st.ToString();
  }
  return st;
}

Result<uint64_t> ClusterObjects::Publish(uint64_t ino, const std::string& path) {
  GPUFS_ASSIGN_OR_RETURN(Publication pub, PreparePublication(ns_, ino, path));
  Result<uint64_t> version = Error(EBUSY, "publish " + path);
  for (int i = 0; i < kPublishTries; ++i) {
    version = node_->Publish(pub.manifest, pub.bytes);
    if (version.ok() || version.status().code() != EBUSY) break;
  }
  if (!version.ok()) return version;
  ++publishes_;
  std::vector<uint64_t> before;
  {
    std::lock_guard lock(mu_);
    if (auto it = published_.find(path); it != published_.end())
      before.push_back(it->second.version);
    // A fetched copy published as it is, or changed, is this node's own now.
    if (auto it = fetched_.find(path); it != fetched_.end()) {
      before.push_back(it->second.version);
      fetched_.erase(it);
    }
    published_[path] = {*version, ino, true};
  }
  SaveReplicas();
  // The versions before are served no more: their fetchers move to this one.
  for (uint64_t v : before) (void)node_->DropReplica(path, v);
  return version;
}

Result<uint64_t> ClusterObjects::Unpublish(const std::string& path) {
  GPUFS_ASSIGN_OR_RETURN(uint64_t version, node_->Unpublish(path));
  uint64_t before = 0;
  {
    std::lock_guard lock(mu_);
    if (auto it = published_.find(path); it != published_.end()) {
      before = it->second.version;
      published_.erase(it);
    }
  }
  if (before != 0) {
    SaveReplicas();
    (void)node_->DropReplica(path, before);
  }
  return version;
}

void ClusterObjects::Changed(const std::string& path) {
  {
    std::lock_guard lock(mu_);
    changes_.push_back(path);
  }
  cv_.notify_all();
}

void ClusterObjects::LocalRemoved(uint64_t object) {
  {
    std::lock_guard lock(mu_);
    bool fetched = false;
    for (const auto& [path, f] : fetched_) fetched = fetched || f.object == object;
    if (!fetched) return;
    removed_.push_back(object);
  }
  cv_.notify_all();
}

void ClusterObjects::DropRemoved(const std::vector<uint64_t>& removed) {
  std::vector<std::pair<std::string, uint64_t>> dropped;
  {
    std::lock_guard lock(mu_);
    for (auto it = fetched_.begin(); it != fetched_.end();) {
      if (std::find(removed.begin(), removed.end(), it->second.object) == removed.end()) {
        ++it;
        continue;
      }
      dropped.emplace_back(it->first, it->second.version);
      it = fetched_.erase(it);
    }
  }
  if (dropped.empty()) return;
  SaveReplicas();
  for (const auto& [path, version] : dropped) {
    // Not served from here on; the bytes go once the sends from them end.
    Status st = node_->DropReplica(path, version);
    GPUFS_LOG(INFO) << "cluster: the local copy of " << path << "@" << version
                    << " was removed or changed here: this node serves it no more"
                    << (st.ok() ? std::string()
                                : " (its replica key stays until the lease ends: " + st.ToString() +
                                      ")");
    ns_.RemoteChanged(path);
  }
}

void ClusterObjects::Work() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (started_ && (!changes_.empty() || !removed_.empty())); });
    if (stop_) return;
    if (!removed_.empty()) {
      std::vector<uint64_t> removed;
      removed.swap(removed_);
      lock.unlock();
      DropRemoved(removed);
      lock.lock();
      continue;
    }
    const std::string path = std::move(changes_.front());
    changes_.pop_front();
    struct Check {
      std::string path;
      Held held;
      bool published;
    };
    std::vector<Check> check;
    for (const auto& [p, h] : fetched_) {
      if (path.empty() || p == path) check.push_back({p, h, false});
    }
    for (const auto& [p, h] : published_) {
      if (path.empty() || p == path) check.push_back({p, h, true});
    }
    lock.unlock();
    ns_.RemoteChanged(path);
    for (const Check& c : check) {
      auto current = node_->Lookup(c.path);
      if (!current.ok()) continue;  // etcd away: kept until it answers
      if (*current && !(*current)->removed && (*current)->version == c.held.version) {
        if (!c.held.served) Reserve(c.path, c.held, c.published);
        continue;
      }
      if (c.published) {
        Unserve(c.path, c.held.version, /*published=*/true);
      } else {
        Retire(c.path, c.held.version, c.held.object);
      }
    }
    lock.lock();
  }
}

void ClusterObjects::Reserve(const std::string& path, const Held& h, bool published) {
  // Served again only if its bytes are still the published ones (a member
  // may have gone, or been replaced, before the last process could say).
  auto manifest = node_->Manifest(path, h.version);
  if (!manifest.ok()) {
    GPUFS_LOG(WARN) << "cluster: the replica " << path << "@" << h.version
                    << " kept from before the restart is not served yet: "
                    << manifest.status().ToString();
    return;
  }
  auto pub = PreparePublication(ns_, h.object, path);
  Status same = pub.ok() ? SameBytes(pub->manifest, *manifest) : pub.status();
  if (!same.ok()) {
    GPUFS_LOG(WARN) << "cluster: the local object " << path << " is no longer " << path << "@"
                    << h.version << " (" << same.ToString()
                    << "): it stays a local object and is not served";
    Unserve(path, h.version, published);
    return;
  }
  // Registered even if etcd is away now: a rejoin registers it again.
  Status registered = node_->RegisterReplica(path, h.version, pub->bytes);
  {
    std::lock_guard lock(mu_);
    auto& held = published ? published_ : fetched_;
    auto it = held.find(path);
    if (it != held.end() && it->second.version == h.version) it->second.served = true;
  }
  GPUFS_LOG(INFO) << "cluster: serving " << path << "@" << h.version << " again (kept across a "
                  << "restart" << (published ? ", published here" : "") << ")"
                  << (registered.ok()
                          ? ""
                          : "; its replica key waits for etcd: " + registered.ToString());
}

void ClusterObjects::Unserve(const std::string& path, uint64_t version, bool published) {
  {
    std::lock_guard lock(mu_);
    auto& held = published ? published_ : fetched_;
    auto it = held.find(path);
    if (it == held.end() || it->second.version != version) return;
    held.erase(it);
  }
  SaveReplicas();
  (void)node_->DropReplica(path, version);
}

void ClusterObjects::LoadReplicas() {
  if (replicas_file_.empty()) return;
  std::ifstream in(replicas_file_);
  if (!in) return;  // none yet
  std::stringstream text;
  text << in.rdbuf();
  json kept = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!kept.is_object()) {
    GPUFS_LOG(WARN) << "cluster: " << replicas_file_ << " is not a JSON object: ignored";
    return;
  }
  for (const auto& [path, f] : kept.items()) {
    if (!f.is_object() || !f.contains("version") || !f.contains("object") ||
        !f["version"].is_number_unsigned() || !f["object"].is_number_unsigned() ||
        (f.contains("published") && !f["published"].is_boolean())) {
      GPUFS_LOG(WARN) << "cluster: " << replicas_file_ << ": a bad record for " << path;
      continue;
    }
    const uint64_t version = f["version"].get<uint64_t>();
    const uint64_t object = f["object"].get<uint64_t>();
    // Looked up without mu_: the Namespace may call LocalRemoved meanwhile.
    auto local = LookupPath(ns_, path);
    if (!local.ok() || local->ino != object) continue;  // gone (or another object) meanwhile
    std::lock_guard lock(mu_);
    (f.value("published", false) ? published_ : fetched_)[path] = {version, object,
                                                                   /*served=*/false};
    changes_.push_back(path);  // checked against the cluster by the worker
  }
}

void ClusterObjects::SaveReplicas() {
  if (replicas_file_.empty()) return;
  json out = json::object();
  {
    std::lock_guard lock(mu_);
    for (const auto& [path, h] : fetched_)
      out[path] = {{"version", h.version}, {"object", h.object}};
    for (const auto& [path, h] : published_)
      out[path] = {{"version", h.version}, {"object", h.object}, {"published", true}};
  }
  std::lock_guard lock(file_mu_);
  Status written = ReplaceFile(replicas_file_, out.dump() + "\n");
  if (!written.ok()) GPUFS_LOG(WARN) << "cluster: replicas file: " << written.ToString();
}

void ClusterObjects::Retire(const std::string& path, uint64_t version, uint64_t object) {
  {
    std::lock_guard lock(mu_);
    auto it = fetched_.find(path);
    if (it == fetched_.end() || it->second.version != version) return;
    fetched_.erase(it);
  }
  SaveReplicas();
  (void)node_->DropReplica(path, version);
  // The local copy, if it is still the one fetched: members, then the object.
  const std::string name(BaseName(path));
  const std::string dir = path.substr(0, path.size() - name.size());
  auto parent = LookupPath(ns_, dir.empty() ? dir : dir.substr(0, dir.size() - 1));
  auto local = parent.ok() ? ns_.Lookup(parent->ino, name) : Result<Attr>(parent.status());
  if (!local.ok() || local->ino != object) return;
  for (uint64_t cookie = 0;;) {
    auto page = ns_.ReadDir(object, cookie, 256);
    if (!page.ok() || page->empty()) break;
    for (const DirEntry& d : *page) {
      cookie = d.next_cookie;
      if (d.name != "." && d.name != ".." && !S_ISDIR(d.attr.mode)) (void)ns_.Unlink(object, d.name);
    }
  }
  Status removed = ns_.Rmdir(parent->ino, name);
  GPUFS_LOG(INFO) << "cluster: " << path << "@" << version
                  << " is no longer the published version; local copy "
                  << (removed.ok() ? "removed" : "kept: " + removed.ToString());
  ns_.RemoteChanged(path);
}

std::string ClusterObjects::StatusJson() {
  json s = node_->StatusJson();
  json fetched = json::object(), published = json::object();
  {
    std::lock_guard lock(mu_);
    for (const auto& [p, f] : fetched_) fetched[p] = f.version;
    for (const auto& [p, h] : published_) published[p] = h.version;
  }
  s["fetched"] = fetched;
  s["published"] = published;
  s["counters"] = json::parse(CountersJson());
  return s.dump(2) + "\n";
}

std::string ClusterObjects::CountersJson() {
  json c = {{"node", node_ ? node_->name() : options_.node},
            {"watching", node_ && node_->registry().watching()},
            {"lease_alive", node_ && node_->registry().alive()},
            {"fetch_requests", fetch_requests_.load()},
            {"fetches_started", node_ ? node_->fetches_started() : 0},
            {"fetches_done", fetches_done_.load()},
            {"fetches_failed", fetches_failed_.load()},
            {"fetched_bytes", fetched_bytes_.load()},
            {"publishes", publishes_.load()}};
  return c.dump();
}

}  // namespace gpufs::cluster
