// The namespace's open handles and the blobs they hold (ActiveBlob).
#include "core/namespace.h"


namespace gpufs {

std::shared_ptr<Namespace::ActiveBlob> Namespace::Activate(const Blob& blob, bool use) {
  auto& slot = active_[blob.id];
  if (!slot) {
    slot = std::make_shared<ActiveBlob>();
    slot->rec = blob;
    slot->size = blob.size;
    // The close mark lives in closed_in_catalog; rec, which writes of the
    // row start from (ReopenForWriting, AllocDevice), never carries it.
    slot->closed_in_catalog = blob.closed;
    slot->rec.closed = false;
  }
  if (use) tiers_.Touch(blob.id);
  return slot;
}

HandleId Namespace::AddHandle(Handle handle, HandleId adopted_id) {
  if (handle.blob) {
    handle.blob->handles++;
    if (handle.writable) handle.blob->writers++;
    entry_opens_[handle.entry]++;
  }
  HandleId id = adopted_id != 0 ? adopted_id : next_handle_++;
  handles_.emplace(id, std::move(handle));
  return id;
}

Result<Namespace::Handle*> Namespace::FindHandle(HandleId id) {
  auto it = handles_.find(id);
  if (it == handles_.end()) return Error(EBADF, "no open handle " + std::to_string(id));
  return &it->second;
}

}  // namespace gpufs
