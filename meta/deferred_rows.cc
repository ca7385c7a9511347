// DeferredRows: the log file, its replay, and the rows that ride in the next
// write transaction (see deferred_rows.h for the contract).
#include "meta/deferred_rows.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <map>

#include "meta/catalog_rows.h"
#include "meta/catalog_sql.h"
#include "util/crc32c.h"
#include "util/file_io.h"
#include "util/log.h"

namespace gpufs {

using namespace catalog_internal;

namespace {

// One deferred write, as it lies in the log. `crc` (CRC-32C of the catalog's
// key, the fields and the name) is stored last: a record the process died
// while writing does not check out, and neither does another catalog's.
struct Record {
  uint64_t seq;   // 0: never written
  uint32_t kind;  // 1: create, 2: update
  uint32_t has;   // kHasBlob | kHasEntry
  uint64_t blob_id, size;
  uint32_t state, owner_uid, closed, checksum_lo;  // checksum_lo, _hi: with kHasChecksum
  uint64_t entry_id, parent, entry_blob;
  uint32_t entry_kind, mode, uid, gid;
  int64_t atime_ns, mtime_ns, ctime_ns;
  uint32_t name_len, checksum_hi;
  char device[32];  // NUL-terminated
  char name[256];   // name_len bytes
  char unused[100];
  uint32_t crc;
};
static_assert(sizeof(Record) == DeferredRows::kRecordBytes);
static_assert(DeferredRows::kMaxDeviceBytes < sizeof(Record::device));
static_assert(DeferredRows::kMaxNameBytes <= sizeof(Record::name));
constexpr uint32_t kHasBlob = 1, kHasEntry = 2, kHasChecksum = 4;
constexpr uint32_t kCreate = 1, kUpdate = 2;

constexpr size_t kHeaderBytes = DeferredRows::kHeaderBytes;
constexpr size_t kFileBytes = kHeaderBytes + DeferredRows::kSlots * sizeof(Record);
constexpr char kMagic[8] = {'G', 'P', 'U', 'F', 'S', 'D', 'R', '2'};

constexpr char kGetSettingSql[] = "SELECT value FROM settings WHERE key = ?";
constexpr char kAddSettingSql[] = "INSERT OR IGNORE INTO settings (key, value) VALUES (?, ?)";
constexpr char kSetAppliedSql[] =
    "INSERT OR REPLACE INTO settings (key, value) VALUES ('deferred_applied', ?)";

Result<int64_t> ReadSetting(Db& db, std::string_view key) {
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kGetSettingSql));
  stmt.BindText(0, key);
  GPUFS_ASSIGN_OR_RETURN(bool found, StepOnce(stmt));
  return found ? stmt.ColumnInt64(0) : 0;
}

// The catalog's key (made once, random) and the last applied sequence number.
Result<std::pair<uint64_t, uint64_t>> ReadKeyAndApplied(Db& db) {
  uint64_t fresh = 0;
  if (::getrandom(&fresh, sizeof fresh, 0) != sizeof fresh) {
    return PosixError("getrandom", errno);
  }
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kAddSettingSql));
    stmt.BindText(0, "deferred_key");
    stmt.BindInt64(1, static_cast<int64_t>(fresh >> 1));
    GPUFS_RETURN_IF_ERROR(stmt.Run());
  }
  GPUFS_ASSIGN_OR_RETURN(int64_t key, ReadSetting(db, "deferred_key"));
  GPUFS_ASSIGN_OR_RETURN(int64_t applied, ReadSetting(db, "deferred_applied"));
  GPUFS_RETURN_IF_ERROR(txn.Commit());
  return std::pair<uint64_t, uint64_t>(static_cast<uint64_t>(key), static_cast<uint64_t>(applied));
}

// The fields, then the name (the bytes after it are not the record's).
uint32_t RecordCrc(uint64_t key, const Record& record) {
  uint32_t crc = Crc32c(0, std::as_bytes(std::span(&key, 1)));
  auto bytes = std::as_bytes(std::span(&record, 1));
  crc = Crc32c(crc, bytes.first(offsetof(Record, name)));
  const size_t name = std::min<size_t>(record.name_len, sizeof record.name);
  return Crc32c(crc, bytes.subspan(offsetof(Record, name), name));
}

// A record's fields from a row's parts (the caller sets seq and crc).
Record Encode(bool create, const std::optional<Blob>& blob, const std::optional<Entry>& entry) {
  Record r;
  std::memset(&r, 0, offsetof(Record, name));
  r.kind = create ? kCreate : kUpdate;
  if (blob) {
    r.has |= kHasBlob;
    r.blob_id = blob->id;
    r.size = blob->size;
    r.state = static_cast<uint32_t>(blob->state);
    r.owner_uid = blob->owner_uid;
    r.closed = blob->closed ? 1 : 0;
    if (blob->checksum) {
      r.has |= kHasChecksum;
      r.checksum_lo = static_cast<uint32_t>(*blob->checksum);
      r.checksum_hi = static_cast<uint32_t>(*blob->checksum >> 32);
    }
    const std::string& device = blob->device.Name();
    std::memcpy(r.device, device.data(), device.size());
  }
  if (entry) {
    r.has |= kHasEntry;
    r.entry_id = entry->id;
    r.parent = entry->parent;
    r.entry_blob = entry->blob;
    r.entry_kind = static_cast<uint32_t>(entry->kind);
    r.mode = entry->mode;
    r.uid = entry->uid;
    r.gid = entry->gid;
    r.atime_ns = entry->atime_ns;
    r.mtime_ns = entry->mtime_ns;
    r.ctime_ns = entry->ctime_ns;
    if (create) {
      r.name_len = static_cast<uint32_t>(entry->name.size());
      std::memcpy(r.name, entry->name.data(), entry->name.size());
    }
  }
  return r;
}

// The inverse of Encode; false when the record names no tier (it does not
// check out).
bool Decode(const Record& r, std::optional<Blob>& blob, std::optional<Entry>& entry) {
  if (r.has & kHasBlob) {
    blob.emplace();
    blob->id = r.blob_id;
    auto device = TierId::Parse(std::string_view(r.device, strnlen(r.device, sizeof r.device)));
    if (!device.ok()) return false;
    blob->device = *device;
    blob->size = r.size;
    blob->state = static_cast<BlobState>(r.state);
    blob->owner_uid = r.owner_uid;
    blob->closed = r.closed != 0;
    if (r.has & kHasChecksum) {
      blob->checksum = static_cast<uint64_t>(r.checksum_hi) << 32 | r.checksum_lo;
    }
  }
  if (r.has & kHasEntry) {
    entry.emplace();
    entry->id = r.entry_id;
    entry->parent = r.parent;
    entry->name.assign(r.name, std::min<size_t>(r.name_len, sizeof r.name));
    entry->kind = static_cast<EntryKind>(r.entry_kind);
    entry->blob = r.entry_blob;
    entry->mode = r.mode;
    entry->uid = r.uid;
    entry->gid = r.gid;
    entry->atime_ns = r.atime_ns;
    entry->mtime_ns = r.mtime_ns;
    entry->ctime_ns = r.ctime_ns;
  }
  return true;
}

Result<uint64_t> LastId(Db& db, std::string_view table) {
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kLastIdSql));
  stmt.BindText(0, table);
  GPUFS_ASSIGN_OR_RETURN(bool found, StepOnce(stmt));
  return found ? static_cast<uint64_t>(stmt.ColumnInt64(0)) : 0;
}

}  // namespace

Result<std::unique_ptr<DeferredRows>> DeferredRows::Open(Db& db) {
  const std::string path = LogPath(db.path());
  auto fail = [&](const Status& status) { return status.Prepend("deferred rows " + path); };
  Result<std::pair<uint64_t, uint64_t>> settings = ReadKeyAndApplied(db);
  if (!settings.ok()) return fail(settings.status());
  const auto [key, applied] = *settings;

  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return fail(PosixError("open", errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return fail(PosixError("stat", errno));
  if (!S_ISREG(st.st_mode)) return fail(Error(EINVAL, "not a regular file"));

  // What the last daemon left: the records after `applied`, in order.
  std::map<uint64_t, Record> found;
  size_t unreadable = 0;
  if (st.st_size != 0 && static_cast<size_t>(st.st_size) != kFileBytes) {
    GPUFS_LOG(WARN) << path << ": " << st.st_size << " bytes, not " << kFileBytes
                    << ": not a log this gpufs wrote; its records are dropped";
  }
  if (static_cast<size_t>(st.st_size) == kFileBytes) {
    std::vector<Record> records(kSlots);
    Status read = ReadAll(fd.get(), kHeaderBytes, std::as_writable_bytes(std::span(records)), path);
    if (!read.ok()) return fail(read);
    for (const Record& r : records) {
      if (r.seq == 0) continue;
      if (RecordCrc(key, r) != r.crc) {
        ++unreadable;
      } else if (r.seq > applied) {
        found[r.seq] = r;
      }
    }
  }
  std::vector<Row> run;
  for (auto it = found.find(applied + 1);
       it != found.end() && it->first == applied + 1 + run.size(); ++it) {
    const Record& r = it->second;
    Row row;
    row.kind = r.kind == kCreate ? Row::Kind::kCreate : Row::Kind::kUpdate;
    if (!Decode(r, row.blob, row.entry)) break;
    run.push_back(std::move(row));
  }
  if (run.size() < found.size() || unreadable > 0) {
    // Only a torn last write or a power failure leaves these: a suffix.
    GPUFS_LOG(WARN) << path << ": " << found.size() - run.size() << " record(s) after a gap and "
                    << unreadable << " that do not check out were dropped";
  }

  void* map = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  std::unique_ptr<DeferredRows> rows(
      new DeferredRows(db, std::move(fd), map == MAP_FAILED ? nullptr : map, key, applied));
  if (rows->map_ == nullptr) return fail(PosixError("mmap", errno));
  for (Row& row : run) {
    if (row.kind == Row::Kind::kCreate && row.entry) {  // ids the last daemon handed out
      rows->SawEntryId(row.entry->id);
      if (row.blob) rows->SawBlobId(row.blob->id);
    }
    rows->Remember(row);
  }
  rows->pending_ = run.size();
  rows->next_seq_ = applied + 1 + run.size();
  if (!run.empty()) {
    GPUFS_LOG(INFO) << path << ": " << run.size()
                    << " catalog write(s) the last daemon logged are written to the catalog";
  }
  Status flushed = rows->Flush();
  if (!flushed.ok()) return fail(flushed);
  Result<uint64_t> last_entry = LastId(db, "entries");
  Result<uint64_t> last_blob = LastId(db, "blobs");
  if (!last_entry.ok()) return fail(last_entry.status());
  if (!last_blob.ok()) return fail(last_blob.status());
  rows->SawEntryId(*last_entry);
  rows->SawBlobId(*last_blob);
  // Everything is in the database now: a fresh log, its blocks allocated by
  // writing them, so that a store into the mapping never meets a full disk.
  Status cleared =
      ::ftruncate(rows->fd_.get(), 0) == 0 ? Status::Ok() : PosixError("truncate", errno);
  if (cleared.ok()) {
    std::vector<std::byte> zeros(kFileBytes);
    std::memcpy(zeros.data(), kMagic, sizeof kMagic);
    cleared = WriteAll(rows->fd_.get(), 0, zeros, path);
  }
  if (!cleared.ok()) return fail(cleared);
  return rows;
}

DeferredRows::DeferredRows(Db& db, UniqueFd fd, void* map, uint64_t key, uint64_t applied)
    : db_(db), fd_(std::move(fd)), map_(map), key_(key), next_seq_(applied + 1) {
  db_.SetWriteHooks({[this] { return ApplyPending(); }, [this] { Applied(); }});
}

DeferredRows::~DeferredRows() {
  if (pending_ > 0) {
    Status flushed = Flush();
    if (!flushed.ok()) {
      GPUFS_LOG(ERROR) << LogPath(db_.path()) << ": " << pending_
                       << " catalog write(s) stay in the log for the next start: "
                       << flushed.ToString();
    }
  }
  db_.SetWriteHooks({});
  if (map_ != nullptr) ::munmap(map_, kFileBytes);
}

bool DeferredRows::Fits(const Blob* blob, const Entry* entry) {
  return (blob == nullptr || blob->device.Name().size() <= kMaxDeviceBytes) &&
         (entry == nullptr || entry->name.size() <= kMaxNameBytes);
}

Status DeferredRows::DeferCreate(const Entry& entry, const Blob* blob) {
  Row row;
  row.kind = Row::Kind::kCreate;
  row.entry = entry;
  if (blob != nullptr) row.blob = *blob;
  return Append(std::move(row));
}

Status DeferredRows::DeferUpdate(const Blob* blob, const Entry* entry) {
  Row row;
  row.kind = Row::Kind::kUpdate;
  if (blob != nullptr) row.blob = *blob;
  if (entry != nullptr) row.entry = *entry;
  return Append(std::move(row));
}

Status DeferredRows::Append(Row row) {
  if (!Fits(row.blob ? &*row.blob : nullptr, row.entry ? &*row.entry : nullptr)) {
    return Error(ENAMETOOLONG, "a device or entry name too long for the log");
  }
  if (pending_ >= kMaxPending) GPUFS_RETURN_IF_ERROR(Flush());
  Record r = Encode(row.kind == Row::Kind::kCreate, row.blob, row.entry);
  r.seq = next_seq_;
  const uint32_t crc = RecordCrc(key_, r);
  auto* slot =
      reinterpret_cast<Record*>(static_cast<std::byte*>(map_) + kHeaderBytes) + r.seq % kSlots;
  std::memcpy(slot, &r, offsetof(Record, name) + r.name_len);
  std::atomic_ref<uint32_t>(slot->crc).store(crc, std::memory_order_release);
  ++next_seq_;
  Remember(row);
  ++pending_;
  return Status::Ok();
}

Status DeferredRows::Flush() {
  if (pending_ == 0) return Status::Ok();
  Transaction txn(db_);  // Begin applies them
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  return txn.Commit();
}

void DeferredRows::SawEntryId(EntryId id) { next_entry_id_ = std::max(next_entry_id_, id + 1); }
void DeferredRows::SawBlobId(BlobId id) { next_blob_id_ = std::max(next_blob_id_, id + 1); }

// Writes each row once, in the state the pending records leave it in (what
// applying them one by one would leave): a create with the close mark and
// seal that followed it is two INSERTs, and a parent is touched once.
Status DeferredRows::ApplyPending() {
  boarded_ = false;
  if (pending_ == 0) return Status::Ok();
  // The checks were made when the records were: an error here other than
  // the disk's cannot happen, so it is logged and the row passed over rather
  // than holding up every later write.
  auto check = [](const Status& status, const std::string& what) -> Result<bool> {
    if (status.ok()) return true;
    if (status.code() == EIO || status.code() == ENOSPC || status.code() == EROFS ||
        status.code() == ENOMEM || status.code() == EBUSY) {
      return status.Prepend("apply deferred catalog writes: " + what);
    }
    GPUFS_LOG(ERROR) << "deferred catalog write passed over (" << what
                     << "): " << status.ToString();
    return false;
  };
  std::vector<EntryId> created;
  created.reserve(created_.size());
  for (const auto& [id, entry] : created_) created.push_back(id);
  std::sort(created.begin(), created.end());  // parents before their children
  for (EntryId id : created) {
    const Entry& entry = created_.at(id);
    if (entry.blob != 0) {
      auto blob = blobs_.find(entry.blob);
      Status inserted = blob == blobs_.end() ? Error(EINVAL, "its blob row is missing")
                                             : InsertBlob(db_, blob->second).status();
      GPUFS_ASSIGN_OR_RETURN(bool ok, check(inserted, "create blob " + std::to_string(entry.blob)));
      if (!ok) continue;
    }
    GPUFS_RETURN_IF_ERROR(
        check(InsertEntry(db_, entry).status(), "create entry " + std::to_string(id)).status());
  }
  if (!created.empty()) {
    // Every id handed out stays taken, even one whose row was passed over.
    for (const auto& [table, next] :
         {std::pair<const char*, uint64_t>{"entries", next_entry_id_}, {"blobs", next_blob_id_}}) {
      GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_.GetCachedStatement(kRaiseLastIdSql));
      stmt.BindInt64(0, static_cast<int64_t>(next - 1));
      stmt.BindText(1, table);
      GPUFS_RETURN_IF_ERROR(stmt.Run());
    }
  }
  for (const auto& [id, blob] : blobs_) {
    if (created_owners_.contains(id)) continue;
    GPUFS_RETURN_IF_ERROR(check(UpdateBlobRow(db_, blob), "blob " + std::to_string(id)).status());
  }
  for (const auto& [id, patch] : patches_) {
    Status patched;
    if (patch.attrs) {
      Entry attrs = *patch.attrs;
      if (patch.touched) attrs.mtime_ns = attrs.ctime_ns = *patch.touched;
      patched = UpdateEntryAttrsRow(db_, attrs);
    } else if (patch.touched) {
      patched = TouchEntry(db_, id, *patch.touched);
    }
    GPUFS_RETURN_IF_ERROR(check(patched, "entry " + std::to_string(id)).status());
  }
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_.GetCachedStatement(kSetAppliedSql));
  stmt.BindInt64(0, static_cast<int64_t>(next_seq_ - 1));
  GPUFS_RETURN_IF_ERROR(stmt.Run());
  boarded_ = true;
  return Status::Ok();
}

void DeferredRows::Applied() {
  ++commits_;
  if (!boarded_) return;
  boarded_ = false;
  pending_ = 0;
  created_.clear();
  created_names_.clear();
  created_owners_.clear();
  blobs_.clear();
  patches_.clear();
}

std::string DeferredRows::NameKey(EntryId parent, std::string_view name) {
  std::string key = std::to_string(parent);
  key += '/';
  key += name;
  return key;
}

void DeferredRows::Remember(const Row& row) {
  if (row.blob) blobs_[row.blob->id] = *row.blob;
  if (!row.entry) return;
  const Entry& entry = *row.entry;
  if (row.kind == Row::Kind::kCreate) {
    created_[entry.id] = entry;
    created_names_[NameKey(entry.parent, entry.name)] = entry.id;
    if (row.blob) created_owners_[row.blob->id] = entry.id;
    // The parent's mtime and ctime.
    if (auto it = created_.find(entry.parent); it != created_.end()) {
      it->second.mtime_ns = it->second.ctime_ns = entry.ctime_ns;
    } else {
      patches_[entry.parent].touched = entry.ctime_ns;
    }
    return;
  }
  if (auto it = created_.find(entry.id); it != created_.end()) {
    CopyEntryAttrs(it->second, entry);
  } else {
    Patch& patch = patches_[entry.id];
    patch.attrs = entry;
    patch.touched.reset();
  }
}

const Entry* DeferredRows::Created(EntryId id) const {
  auto it = created_.find(id);
  return it == created_.end() ? nullptr : &it->second;
}

std::optional<EntryId> DeferredRows::CreatedName(EntryId parent, std::string_view name) const {
  if (created_names_.empty()) return std::nullopt;
  auto it = created_names_.find(NameKey(parent, name));
  if (it == created_names_.end()) return std::nullopt;
  return it->second;
}

std::optional<EntryId> DeferredRows::CreatedOwner(BlobId blob) const {
  auto it = created_owners_.find(blob);
  if (it == created_owners_.end()) return std::nullopt;
  return it->second;
}

const Blob* DeferredRows::PendingBlob(BlobId id) const {
  auto it = blobs_.find(id);
  return it == blobs_.end() ? nullptr : &it->second;
}

void DeferredRows::Overlay(Entry& entry) const {
  auto it = patches_.find(entry.id);
  if (it == patches_.end()) return;
  if (it->second.attrs) CopyEntryAttrs(entry, *it->second.attrs);
  if (it->second.touched) entry.mtime_ns = entry.ctime_ns = *it->second.touched;
}

}  // namespace gpufs
