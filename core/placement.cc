// Placement: which store holds a blob, and where new blobs go.
#include "core/namespace.h"

#include "proto/xattr_names.h"

namespace gpufs {

BulkStore* Namespace::StoreFor(const TierId& device) {
  auto it = stores_.find(device);
  return it == stores_.end() ? nullptr : it->second.get();
}

// The nearest enclosing object's placement, else the default device.
std::optional<TierId> Namespace::PlacementOf(EntryId id) {
  auto value = catalog_->GetXattr(id, xattr::kDevice);
  if (!value.ok()) return std::nullopt;
  auto device = TierId::Parse(*value);
  if (!device.ok() || !stores_.contains(*device)) return std::nullopt;
  return *device;
}

TierId Namespace::DeviceFor(EntryId parent) {
  for (int depth = 0; parent != 0 && depth < 256; ++depth) {
    if (auto device = PlacementOf(parent)) return *device;
    if (parent == kRootEntryId) break;
    auto entry = catalog_->GetEntry(parent);
    if (!entry.ok()) break;
    parent = entry->parent;
  }
  return default_device_;
}

Result<TierId> Namespace::DeviceForDeviceMemory() {
  if (default_device_.is_gpu() && stores_.contains(default_device_)) return default_device_;
  for (const auto& [device, store] : stores_) {
    if (device.is_gpu()) return device;
  }
  return Error(ENODEV, "this daemon serves no GPU (started with --store host?)");
}

HostBuffer Namespace::AllocateIoBuffer(size_t bytes) { return tiers_.AllocateIoBuffer(bytes); }

}  // namespace gpufs
