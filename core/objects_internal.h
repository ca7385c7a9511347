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
// On a staging member its object's publish detached: the entry id of the
// object it was published in, for a re-sent SEAL_OBJECT (a takeover) to
// tell the kernel about the name. Internal too; goes with the member.
inline constexpr std::string_view kPublishedInXattr = "trusted.gpufs.published_in";

struct ns::PendingObject {
  EntryId object = 0;  // the hidden object
  TierId device;       // where every member lives
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
  // The rows of the object and its members, ids reserved, while they are
  // still to be written (core/objects_alloc.cc); null once written or
  // dropped. GUARDED_BY(mu_), as is:
  struct Rows {
    Entry object;
    std::vector<std::pair<std::string, std::string>> xattrs;  // the object's
    std::vector<Catalog::NewMember> members;                  // as `members`
  };
  std::unique_ptr<Rows> rows;
  // Why the object was dropped before its rows were written (its memory
  // let go): what its seal answers.
  Status rows_error;
};

}  // namespace gpufs
