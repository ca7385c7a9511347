#include "core/remote_inodes.h"

namespace gpufs {

void RemoteInodes::StartAt(uint64_t first) {
  std::lock_guard lock(mu_);
  next_ = first;
}

uint64_t RemoteInodes::InodeFor(uint64_t parent, std::string_view name,
                                const RemoteObject& object) {
  std::lock_guard lock(mu_);
  auto key = std::make_tuple(parent, std::string(name), object.version);
  if (auto it = index_.find(key); it != index_.end()) return it->second;
  const uint64_t ino = next_++;
  index_.emplace(std::move(key), ino);
  nodes_[ino] = Node{parent, std::string(name), object, 0};
  return ino;
}

std::optional<RemoteInodes::Node> RemoteInodes::Find(uint64_t ino) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(ino);
  if (it == nodes_.end()) return std::nullopt;
  return it->second;
}

void RemoteInodes::SetLocal(uint64_t ino, uint64_t local) {
  std::lock_guard lock(mu_);
  if (auto it = nodes_.find(ino); it != nodes_.end()) it->second.local = local;
}

std::vector<std::pair<uint64_t, RemoteInodes::Node>> RemoteInodes::Of(const std::string& path) {
  std::lock_guard lock(mu_);
  std::vector<std::pair<uint64_t, Node>> out;
  for (const auto& [ino, node] : nodes_) {
    if (path.empty() || node.object.path == path) out.emplace_back(ino, node);
  }
  return out;
}

void RemoteInodes::RetireFetched(const std::string& path) {
  std::lock_guard lock(mu_);
  for (auto it = index_.begin(); it != index_.end();) {
    const Node& node = nodes_.at(it->second);
    if (node.local != 0 && (path.empty() || node.object.path == path)) {
      it = index_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace gpufs
