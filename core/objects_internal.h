// What core/objects_*.cc and recovery.cc share about objects written as a
// whole: the pending object a staging handle holds, and its mark.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/namespace.h"

namespace gpufs {

// On a pending object: the entry id of its staging member. Internal (not a
// user.* name): never listed, never settable through FUSE.
inline constexpr std::string_view kPendingXattr = "trusted.gpufs.pending_object";

struct ns::PendingObject {
  EntryId object = 0;  // the hidden object
  std::string device;  // where every member lives
  SharingKey key;      // of every member (same object, owner, group and mode)
  uint64_t bytes = 0;  // the layout's end
  struct Member {
    EntryId entry = 0;
    BlobId blob = 0;
    uint64_t offset = 0;
    uint64_t size = 0;
    std::shared_ptr<ActiveBlob> active;  // held while pending
  };
  std::vector<Member> members;  // in layout order
  bool sealed = false;          // GUARDED_BY(mu_)
};

}  // namespace gpufs
