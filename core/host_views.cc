// In-place views of sealed host bytes (Namespace::ViewHostBytes): what
// pins a viewed blob's place, and what frees a place a move left while it
// was viewed.
//
// Why a view stays valid: the caller keeps a handle of the blob open, so
// the blob is never freed, spilled (an open blob never spills) or changed
// (sealed); replacing or removing its member leaves the handle its blob.
// The one thing that could take the place away is a move under an open
// handle (a migrate, a fault back to map it). A view is only taken under a
// shared io_mu, and a move switches places holding it exclusively, so the
// move sees every view taken before it; it then keeps the old place
// (KeepForViewsLocked) instead of freeing it, and the last view to go
// frees it.
//
// The view count is an atomic, so that letting a view go (on a network
// thread, once its send completed) takes no lock but in the rare case of
// a kept place: the move stores views_kept before it reads the count, the
// view drops the count before it reads views_kept (both sequentially
// consistent), so either the move sees the view and the view then sees
// the flag, or the move sees no view and frees the place itself.
#include <mutex>
#include <shared_mutex>

#include "core/namespace.h"

namespace gpufs {

Result<std::optional<Namespace::HostView>> Namespace::ViewHostBytes(HandleId id) {
  std::shared_ptr<ActiveBlob> blob;
  {
    std::unique_lock lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return std::optional<HostView>();
    auto it = handles_.find(id);
    if (it == handles_.end()) return Error(EBADF, "view: no handle " + std::to_string(id));
    if (!it->second.blob) return std::optional<HostView>();
    blob = it->second.blob;
  }
  std::shared_lock io(blob->io_mu, std::try_to_lock);
  if (!io.owns_lock() || blob->rec.state != BlobState::kSealed) return std::optional<HostView>();
  const uint64_t size = blob->size.load();
  BulkStore* store = StoreFor(blob->rec.device);
  const std::span<std::byte> bytes = store != nullptr ? store->HostBytes(blob->rec.id)
                                                      : std::span<std::byte>();
  if (size == 0 || bytes.size() < size) return std::optional<HostView>();
  blob->host_views.fetch_add(1);
  std::shared_ptr<const void> hold(blob.get(),
                                   [this, blob](const void*) { ReleaseHostView(blob); });
  return std::optional<HostView>(HostView{bytes.first(size), std::move(hold)});
}

void Namespace::ReleaseHostView(const std::shared_ptr<ActiveBlob>& blob) {
  if (blob->host_views.fetch_sub(1) != 1 || !blob->views_kept.load()) return;
  FreeQueuedOnExit free_queued{this};
  std::lock_guard lock(mu_);
  DoomKeptForViewsLocked(*blob);
}

bool Namespace::KeepForViewsLocked(ActiveBlob& blob, const TierId& old) {
  BulkStore* store = StoreFor(old);
  if (store == nullptr || store->HostBytes(blob.rec.id).empty()) return false;  // never viewed
  blob.views_kept.store(true);
  if (blob.host_views.load() == 0) {
    if (blob.kept_for_views.empty()) blob.views_kept.store(false);
    return false;
  }
  blob.kept_for_views.push_back(old);
  return true;
}

void Namespace::DoomKeptForViewsLocked(ActiveBlob& blob) {
  if (blob.host_views.load() != 0) return;
  for (const TierId& device : blob.kept_for_views) doomed_.emplace_back(device, blob.rec.id);
  blob.kept_for_views.clear();
  blob.views_kept.store(false);
}

}  // namespace gpufs
