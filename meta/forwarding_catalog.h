// ForwardingCatalog: a Catalog that hands every call to the catalog it wraps.
// A decorator (UsageCatalog, a test's fault injector) derives from it and
// overrides only the calls it adds to; the rest stay plain forwards.
// Not thread-safe, like every Catalog.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "meta/catalog.h"

namespace gpufs {

class ForwardingCatalog : public Catalog {
 public:
  explicit ForwardingCatalog(std::unique_ptr<Catalog> inner) : inner_(std::move(inner)) {}

  Result<Entry> GetEntry(EntryId id) override { return inner_->GetEntry(id); }
  Result<Entry> Lookup(EntryId parent, std::string_view name) override {
    return inner_->Lookup(parent, name);
  }
  Result<std::vector<Entry>> ListChildren(EntryId parent, EntryId after, size_t limit) override {
    return inner_->ListChildren(parent, after, limit);
  }
  Result<bool> HasChildren(EntryId parent) override { return inner_->HasChildren(parent); }
  Result<uint64_t> CountChildObjects(EntryId parent) override {
    return inner_->CountChildObjects(parent);
  }
  Result<uint64_t> CountEntries() override { return inner_->CountEntries(); }
  Result<Entry> CreateEntry(const Entry& entry, const std::optional<Blob>& blob) override {
    return inner_->CreateEntry(entry, blob);
  }
  Result<std::vector<Entry>> CreateMembers(const std::vector<NewMember>& members) override {
    return inner_->CreateMembers(members);
  }
  Result<ReservedIds> ReserveIds(uint64_t entries, uint64_t blobs) override {
    return inner_->ReserveIds(entries, blobs);
  }
  Status UpdateEntryAttrs(const Entry& entry) override { return inner_->UpdateEntryAttrs(entry); }
  Status Detach(EntryId id, int64_t now_ns) override { return inner_->Detach(id, now_ns); }
  Result<EntryId> Move(EntryId id, EntryId new_parent, std::string_view new_name,
                       int64_t now_ns) override {
    return inner_->Move(id, new_parent, new_name, now_ns);
  }
  Result<std::optional<Blob>> Purge(EntryId id) override { return inner_->Purge(id); }
  Result<std::vector<Blob>> RemoveMembers(EntryId object, const std::vector<EntryId>& members,
                                          int64_t now_ns) override {
    return inner_->RemoveMembers(object, members, now_ns);
  }
  Result<std::optional<Blob>> Remove(EntryId id, int64_t now_ns) override {
    return inner_->Remove(id, now_ns);
  }
  Result<std::vector<EntryId>> ListDetached() override { return inner_->ListDetached(); }

  Result<Blob> LinkNewBlob(EntryId entry, const Blob& blob, BlobId* old_blob) override {
    return inner_->LinkNewBlob(entry, blob, old_blob);
  }
  Result<Blob> CreateBlob(const Blob& blob) override { return inner_->CreateBlob(blob); }
  Result<BlobId> LinkBlob(EntryId entry, BlobId blob) override {
    return inner_->LinkBlob(entry, blob);
  }
  Result<Blob> GetBlob(BlobId id) override { return inner_->GetBlob(id); }
  Status Batch(const std::function<Status()>& body) override { return inner_->Batch(body); }
  Result<std::vector<EntryId>> EntriesWithXattr(std::string_view name) override {
    return inner_->EntriesWithXattr(name);
  }
  Status UpdateBlob(const Blob& blob) override { return inner_->UpdateBlob(blob); }
  Status UpdateBlobs(const std::vector<Blob>& blobs) override { return inner_->UpdateBlobs(blobs); }
  Status UpdateBlobAndEntryAttrs(const Blob& blob, const Entry& entry) override {
    return inner_->UpdateBlobAndEntryAttrs(blob, entry);
  }
  Status DeleteBlob(BlobId id) override { return inner_->DeleteBlob(id); }
  Result<std::vector<Blob>> ListBlobs() override { return inner_->ListBlobs(); }
  Result<std::vector<BlobId>> ListUnlinkedBlobs() override { return inner_->ListUnlinkedBlobs(); }
  Result<EntryId> EntryOfBlob(BlobId blob) override { return inner_->EntryOfBlob(blob); }

  Result<std::string> GetXattr(EntryId id, std::string_view name) override {
    return inner_->GetXattr(id, name);
  }
  Status SetXattr(EntryId id, std::string_view name, std::string_view value, int flags) override {
    return inner_->SetXattr(id, name, value, flags);
  }
  Result<std::vector<std::string>> ListXattrs(EntryId id) override {
    return inner_->ListXattrs(id);
  }
  Status RemoveXattr(EntryId id, std::string_view name) override {
    return inner_->RemoveXattr(id, name);
  }
  Result<uint64_t> NextGeneration() override { return inner_->NextGeneration(); }

 protected:
  std::unique_ptr<Catalog> inner_;  // never null
};

}  // namespace gpufs
