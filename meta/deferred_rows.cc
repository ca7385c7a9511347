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
#include "util/crc32c.h"
#include "util/file_io.h"
#include "util/log.h"

namespace gpufs {

using namespace catalog_internal;

// One deferred update, as it lies in the log. `crc` (CRC-32C of the catalog's
// key and the bytes before it) is stored last: a record the process died
// while writing does not check out, and neither does another catalog's.
namespace {

struct Record {
  uint64_t seq;      // 0: never written
  uint64_t blob_id;  // 0: no blob row in this record
  uint64_t size;
  uint32_t state;
  uint32_t owner_uid;
  uint32_t closed;
  uint32_t has_entry;
  uint64_t entry_id;
  uint32_t mode, uid, gid, reserved;
  int64_t atime_ns, mtime_ns, ctime_ns;
  char device[32];  // NUL-terminated
  uint32_t reserved2;
  uint32_t crc;
};
static_assert(sizeof(Record) == 128);
static_assert(DeferredRows::kMaxDeviceBytes < sizeof(Record::device));

constexpr size_t kHeaderBytes = 4096;
constexpr size_t kFileBytes = kHeaderBytes + DeferredRows::kSlots * 128;
constexpr char kMagic[8] = {'G', 'P', 'U', 'F', 'S', 'D', 'R', '1'};

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
  return std::pair<uint64_t, uint64_t>(static_cast<uint64_t>(key),
                                       static_cast<uint64_t>(applied));
}

uint32_t RecordCrc(uint64_t key, const Record& record) {
  uint32_t crc = Crc32c(0, std::as_bytes(std::span(&key, 1)));
  return Crc32c(crc, std::as_bytes(std::span(&record, 1)).first(offsetof(Record, crc)));
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
  for (auto it = found.find(applied + 1); it != found.end() && it->first == applied + 1 + run.size();
       ++it) {
    const Record& r = it->second;
    Row row;
    row.seq = r.seq;
    if (r.blob_id != 0) {
      Blob blob;
      blob.id = r.blob_id;
      blob.device.assign(r.device, strnlen(r.device, sizeof r.device));
      blob.size = r.size;
      blob.state = static_cast<BlobState>(r.state);
      blob.owner_uid = r.owner_uid;
      blob.closed = r.closed != 0;
      row.blob = blob;
    }
    if (r.has_entry != 0) {
      Entry entry;
      entry.id = r.entry_id;
      entry.mode = r.mode;
      entry.uid = r.uid;
      entry.gid = r.gid;
      entry.atime_ns = r.atime_ns;
      entry.mtime_ns = r.mtime_ns;
      entry.ctime_ns = r.ctime_ns;
      row.entry = entry;
    }
    run.push_back(std::move(row));
  }
  if (run.size() < found.size() || unreadable > 0) {
    // Only a torn last write or a power failure leaves these: a suffix.
    GPUFS_LOG(WARN) << path << ": " << found.size() - run.size()
                    << " record(s) after a gap and " << unreadable
                    << " that do not check out were dropped";
  }

  void* map = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  std::unique_ptr<DeferredRows> rows(
      new DeferredRows(db, std::move(fd), map == MAP_FAILED ? nullptr : map, key, applied));
  if (rows->map_ == nullptr) return fail(PosixError("mmap", errno));
  for (Row& row : run) {
    rows->Remember(row);
    rows->pending_.push_back(std::move(row));
  }
  rows->next_seq_ = applied + 1 + run.size();
  if (!run.empty()) {
    GPUFS_LOG(INFO) << path << ": " << run.size()
                    << " row update(s) the last daemon logged are written to the catalog";
  }
  Status flushed = rows->Flush();
  if (!flushed.ok()) return fail(flushed);
  // Everything is in the database now: a fresh log, its blocks allocated by
  // writing them, so that a store into the mapping never meets a full disk.
  Status cleared = ::ftruncate(rows->fd_.get(), 0) == 0
                       ? Status::Ok()
                       : PosixError("truncate", errno);
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
  if (!pending_.empty()) {
    Status flushed = Flush();
    if (!flushed.ok()) {
      GPUFS_LOG(ERROR) << LogPath(db_.path()) << ": " << pending_.size()
                       << " row update(s) stay in the log for the next start: "
                       << flushed.ToString();
    }
  }
  db_.SetWriteHooks({});
  if (map_ != nullptr) ::munmap(map_, kFileBytes);
}

Status DeferredRows::Defer(const Blob* blob, const Entry* entry) {
  if (pending_.size() >= kMaxPending) GPUFS_RETURN_IF_ERROR(Flush());
  Row row;
  row.seq = next_seq_;
  Record r{};
  r.seq = row.seq;
  if (blob != nullptr) {
    if (blob->device.size() > kMaxDeviceBytes) {
      return Error(ENAMETOOLONG, "device name " + blob->device + " does not fit the log");
    }
    row.blob = *blob;
    r.blob_id = blob->id;
    r.size = blob->size;
    r.state = static_cast<uint32_t>(blob->state);
    r.owner_uid = blob->owner_uid;
    r.closed = blob->closed ? 1 : 0;
    std::memcpy(r.device, blob->device.data(), blob->device.size());
  }
  if (entry != nullptr) {
    row.entry = *entry;
    r.has_entry = 1;
    r.entry_id = entry->id;
    r.mode = entry->mode;
    r.uid = entry->uid;
    r.gid = entry->gid;
    r.atime_ns = entry->atime_ns;
    r.mtime_ns = entry->mtime_ns;
    r.ctime_ns = entry->ctime_ns;
  }
  const uint32_t crc = RecordCrc(key_, r);
  auto* slot = reinterpret_cast<Record*>(static_cast<std::byte*>(map_) + kHeaderBytes) +
               row.seq % kSlots;
  std::memcpy(slot, &r, offsetof(Record, crc));
  std::atomic_ref<uint32_t>(slot->crc).store(crc, std::memory_order_release);
  ++next_seq_;
  Remember(row);
  pending_.push_back(std::move(row));
  return Status::Ok();
}

Status DeferredRows::Flush() {
  if (pending_.empty()) return Status::Ok();
  Transaction txn(db_);  // Begin applies them
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  return txn.Commit();
}

Status DeferredRows::ApplyPending() {
  boarded_ = 0;
  if (pending_.empty()) return Status::Ok();
  for (const Row& row : pending_) {
    Status blob = row.blob ? UpdateBlobRow(db_, *row.blob) : Status::Ok();
    Status entry = row.entry ? UpdateEntryAttrsRow(db_, *row.entry) : Status::Ok();
    for (const Status* status : {&blob, &entry}) {
      if (status->ok()) continue;
      if (status->code() != ENOENT) return status->Prepend("apply a deferred row update");
      // Deferred only for rows that existed, and every later write applies
      // the log first: this cannot happen, so say so and go on.
      GPUFS_LOG(ERROR) << "deferred row update " << row.seq << " found its row gone: "
                       << status->ToString();
    }
  }
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_.GetCachedStatement(kSetAppliedSql));
  stmt.BindInt64(0, static_cast<int64_t>(pending_.back().seq));
  GPUFS_RETURN_IF_ERROR(stmt.Run());
  boarded_ = pending_.size();
  return Status::Ok();
}

void DeferredRows::Applied() {
  if (boarded_ == 0) return;
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(boarded_));
  boarded_ = 0;
  blobs_.clear();
  entries_.clear();
  for (const Row& row : pending_) Remember(row);
}

void DeferredRows::Remember(const Row& row) {
  if (row.blob) blobs_[row.blob->id] = *row.blob;
  if (row.entry) entries_[row.entry->id] = *row.entry;
}

void DeferredRows::Overlay(Blob& blob) const {
  if (auto it = blobs_.find(blob.id); it != blobs_.end()) blob = it->second;
}

void DeferredRows::Overlay(Entry& entry) const {
  auto it = entries_.find(entry.id);
  if (it == entries_.end()) return;
  const Entry& attrs = it->second;
  entry.mode = (entry.mode & S_IFMT) | (attrs.mode & ~static_cast<uint32_t>(S_IFMT));
  entry.uid = attrs.uid;
  entry.gid = attrs.gid;
  entry.atime_ns = attrs.atime_ns;
  entry.mtime_ns = attrs.mtime_ns;
  entry.ctime_ns = attrs.ctime_ns;
}

}  // namespace gpufs
