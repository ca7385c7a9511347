// Deferred row updates (meta/deferred_rows.h) of the daemon's catalog
// (exclusive locking): what reads see at once, what a killed process leaves,
// and the order against later transactions. "Killed" is a forked child that
// leaves with _exit, so no destructor writes anything.
#include "meta/deferred_rows.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "meta/sqlite_catalog.h"
#include "meta/sqlite_catalog_fixture.h"

namespace gpufs {
namespace {

using namespace meta_test;

class DeferredRowsTest : public SqliteCatalogTest {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    path_ = dir_.path() + "/catalog.db";
    Reopen(Locking::kExclusive);
    Entry made = Create(kRootEntryId, "f", EntryKind::kBlob, Unsealed());
    file_ = made;
    ASSERT_NE(file_.blob, 0u);
  }

  static Blob Unsealed() {
    Blob blob = MakeBlob(0);
    blob.state = BlobState::kUnsealed;
    return blob;
  }

  // Runs `body` against the catalog in a child that then dies without
  // closing it (the parent's catalog is closed meanwhile: exclusive lock).
  void RunAndDie(const std::function<void(SqliteCatalog&)>& body) {
    catalog_.reset();
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto catalog = SqliteCatalog::Open(path_, kUid, kGid, 0755);
      if (!catalog.ok()) ::_exit(2);
      body(**catalog);
      ::_exit(::testing::Test::HasFailure() ? 3 : 0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  // RunAndDie, then the next daemon's catalog.
  void InAKilledProcess(const std::function<void(SqliteCatalog&)>& body) {
    RunAndDie(body);
    Reopen(Locking::kExclusive);
  }

  Blob Closed(uint64_t size) {
    Blob blob = Unsealed();
    blob.id = file_.blob;
    blob.size = size;
    blob.closed = true;
    return blob;
  }

  Entry file_;
};

TEST_F(DeferredRowsTest, ReadsSeeAnUpdateBeforeItReachesSqlite) {
  Blob closed = Closed(7);
  Entry attrs = file_;
  attrs.mode = S_IFREG | 0600;
  attrs.mtime_ns = 555;
  ASSERT_TRUE(catalog_->UpdateBlobAndEntryAttrs(closed, attrs).ok());

  EXPECT_EQ(catalog_->GetBlob(file_.blob)->size, 7u);
  EXPECT_TRUE(catalog_->GetBlob(file_.blob)->closed);
  auto blobs = catalog_->ListBlobs();
  ASSERT_TRUE(blobs.ok());
  ASSERT_EQ(blobs->size(), 1u);
  EXPECT_EQ((*blobs)[0].size, 7u);
  for (const Result<Entry>& entry :
       {catalog_->GetEntry(file_.id), catalog_->Lookup(kRootEntryId, "f")}) {
    ASSERT_TRUE(entry.ok());
    EXPECT_EQ(entry->mode, S_IFREG | 0600u);
    EXPECT_EQ(entry->mtime_ns, 555);
  }
  auto children = catalog_->ListChildren(kRootEntryId, 0, 10);
  ASSERT_TRUE(children.ok());
  ASSERT_EQ(children->size(), 1u);
  EXPECT_EQ((*children)[0].mtime_ns, 555);
}

// A seal's checksum rides in the log like the rest of the row, and is there
// after the death of the process that logged it.
TEST_F(DeferredRowsTest, AChecksumSurvivesTheDeathOfItsProcess) {
  InAKilledProcess([&](SqliteCatalog& catalog) {
    Blob sealed = Closed(7);
    sealed.state = BlobState::kSealed;
    sealed.checksum = 0x8000000000000001ull;
    EXPECT_TRUE(catalog.UpdateBlob(sealed).ok());
    EXPECT_EQ(catalog.GetBlob(file_.blob)->checksum, 0x8000000000000001ull);
  });
  auto blob = catalog_->GetBlob(file_.blob);
  ASSERT_TRUE(blob.ok());
  EXPECT_EQ(blob->state, BlobState::kSealed);
  EXPECT_EQ(blob->checksum, 0x8000000000000001ull);
  Blob cleared = *blob;
  cleared.checksum.reset();
  ASSERT_TRUE(catalog_->UpdateBlob(cleared).ok());
  Reopen(Locking::kExclusive);
  EXPECT_FALSE(catalog_->GetBlob(file_.blob)->checksum.has_value());
}

TEST_F(DeferredRowsTest, MissingRowsAreStillENOENT) {
  Blob ghost = Closed(1);
  ghost.id = file_.blob + 100;
  EXPECT_EQ(catalog_->UpdateBlob(ghost).code(), ENOENT);
  Entry nobody = file_;
  nobody.id = file_.id + 100;
  EXPECT_EQ(catalog_->UpdateEntryAttrs(nobody).code(), ENOENT);
  EXPECT_EQ(catalog_->UpdateBlobAndEntryAttrs(Closed(1), nobody).code(), ENOENT);
  Blob stateless = Closed(1);
  stateless.state = static_cast<BlobState>(99);
  EXPECT_EQ(catalog_->UpdateBlob(stateless).code(), EINVAL);
  // Nothing of the refused calls is pending.
  EXPECT_EQ(catalog_->GetBlob(file_.blob)->size, 0u);
}

TEST_F(DeferredRowsTest, AnUpdateSurvivesTheDeathOfItsProcess) {
  InAKilledProcess([&](SqliteCatalog& c) {
    EXPECT_TRUE(c.UpdateBlob(Closed(42)).ok());
    Entry attrs = file_;
    attrs.uid = 7;
    EXPECT_TRUE(c.UpdateEntryAttrs(attrs).ok());
  });
  EXPECT_EQ(catalog_->GetBlob(file_.blob)->size, 42u);
  EXPECT_TRUE(catalog_->GetBlob(file_.blob)->closed);
  EXPECT_EQ(catalog_->GetEntry(file_.id)->uid, 7u);
  // The reopen wrote them to SQLite: a second connection sees them.
  catalog_.reset();
  EXPECT_EQ(CountRows("blobs", "size = 42 AND closed = 1"), 1);
  EXPECT_EQ(CountRows("entries", "uid = 7"), 1);
}

TEST_F(DeferredRowsTest, ALaterTransactionIsNeverUndoneByAReplay) {
  // The attributes are deferred, then a move (a transaction) sets the ctime:
  // the move carries the update first, so a replay must not put the old
  // ctime back.
  InAKilledProcess([&](SqliteCatalog& c) {
    Entry attrs = file_;
    attrs.ctime_ns = 111;
    EXPECT_TRUE(c.UpdateEntryAttrs(attrs).ok());
    EXPECT_TRUE(c.Move(file_.id, kRootEntryId, "g", 999).ok());
    EXPECT_TRUE(c.UpdateBlob(Closed(3)).ok());  // pending at the kill
  });
  auto entry = catalog_->Lookup(kRootEntryId, "g");
  ASSERT_TRUE(entry.ok());
  EXPECT_EQ(entry->ctime_ns, 999);
  EXPECT_EQ(catalog_->GetBlob(file_.blob)->size, 3u);
}

TEST_F(DeferredRowsTest, ATornRecordEndsTheReplay) {
  // Records 2, 3, 4 (SetUp's create was 1); then the second is torn, as a
  // power failure that kept the third might leave it: the first is applied,
  // the rest dropped.
  RunAndDie([&](SqliteCatalog& c) {
    for (uint64_t size : {10, 20, 30}) EXPECT_TRUE(c.UpdateBlob(Closed(size)).ok());
  });
  int fd = ::open(DeferredRows::LogPath(path_).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const char junk = 0x5a;
  const off_t size_field = 24;  // after seq, kind, has, blob id
  ASSERT_EQ(::pwrite(fd, &junk, 1,
                     DeferredRows::kHeaderBytes + 3 * DeferredRows::kRecordBytes + size_field),
            1);
  ::close(fd);
  Reopen(Locking::kExclusive);
  EXPECT_EQ(catalog_->GetBlob(file_.blob)->size, 10u);
  // The log starts afresh: what comes next is kept.
  InAKilledProcess([&](SqliteCatalog& c) { EXPECT_TRUE(c.UpdateBlob(Closed(40)).ok()); });
  EXPECT_EQ(catalog_->GetBlob(file_.blob)->size, 40u);
}

TEST_F(DeferredRowsTest, AnotherCatalogsLogIsIgnored) {
  // Another catalog with the same rows (entry 2, blob 1)...
  TempDir other_dir;
  const std::string other = other_dir.path() + "/catalog.db";
  {
    auto c = SqliteCatalog::Open(other, kUid, kGid, 0755);
    ASSERT_TRUE(c.ok());
    auto made = (*c)->CreateEntry(NewEntry(kRootEntryId, "f", EntryKind::kBlob), Unsealed());
    ASSERT_TRUE(made.ok());
    ASSERT_EQ(made->blob, file_.blob);
  }
  // ...is handed this one's log with an update pending.
  RunAndDie([&](SqliteCatalog& c) { EXPECT_TRUE(c.UpdateBlob(Closed(6)).ok()); });
  std::filesystem::copy_file(DeferredRows::LogPath(path_), DeferredRows::LogPath(other),
                             std::filesystem::copy_options::overwrite_existing);
  {
    auto c = SqliteCatalog::Open(other, kUid, kGid, 0755);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto blob = (*c)->GetBlob(file_.blob);
    ASSERT_TRUE(blob.ok());
    EXPECT_EQ(blob->size, 0u);
    EXPECT_FALSE(blob->closed);
  }
  Reopen(Locking::kExclusive);
  EXPECT_EQ(catalog_->GetBlob(file_.blob)->size, 6u);
}

TEST_F(DeferredRowsTest, AnIdHandedOutIsNeverHandedOutAgain) {
  // A create whose rows cannot be written at replay (its blob id was taken
  // meanwhile, over a second connection) is passed over; its entry id was
  // handed out all the same, and the next create must not get it again.
  EntryId lost = 0;
  RunAndDie([&](SqliteCatalog& c) {
    auto made = c.CreateEntry(NewEntry(kRootEntryId, "x", EntryKind::kBlob), Unsealed());
    ASSERT_TRUE(made.ok());
    std::ofstream(dir_.path() + "/ids") << made->id << " " << made->blob;
  });
  BlobId taken = 0;
  std::ifstream(dir_.path() + "/ids") >> lost >> taken;
  ASSERT_NE(lost, 0u);
  {
    auto db = Db::Open(path_);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE(
        (*db)
            ->Execute("INSERT INTO blobs (id, device, size, state, owner_uid, closed) VALUES (" +
                      std::to_string(taken) + ", 'host', 0, 1, 0, 0)")
            .ok());
  }
  Reopen(Locking::kExclusive);
  EXPECT_EQ(catalog_->Lookup(kRootEntryId, "x").status().code(), ENOENT);
  // Again from SQLite's own counter alone: a start with nothing pending.
  Reopen(Locking::kExclusive);
  auto next = catalog_->CreateEntry(NewEntry(kRootEntryId, "y", EntryKind::kBlob), Unsealed());
  ASSERT_TRUE(next.ok());
  EXPECT_GT(next->id, lost);
}

// The catalog keeps a blob's tier as its name; a row whose name TierId
// does not take reads as a lost blob (EIO to its readers), never as some
// other tier's bytes, and the rest of the catalog reads as before.
TEST_F(DeferredRowsTest, ABlobRowNamingNoTierReadsAsLost) {
  catalog_.reset();
  {
    auto db = Db::Open(path_);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE(
        (*db)
            ->Execute("UPDATE blobs SET device = 'gpu0' WHERE id = " + std::to_string(file_.blob))
            .ok());
  }
  Reopen(Locking::kExclusive);
  auto blob = catalog_->GetBlob(file_.blob);
  ASSERT_TRUE(blob.ok()) << blob.status().ToString();
  EXPECT_EQ(blob->state, BlobState::kLost);
  auto all = catalog_->ListBlobs();
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_FALSE(all->empty());
}

TEST_F(DeferredRowsTest, ManyUpdatesNeverOverrunTheLog) {
  const uint64_t n = 3 * DeferredRows::kSlots + 5;
  InAKilledProcess([&](SqliteCatalog& c) {
    for (uint64_t size = 1; size <= n; ++size) {
      if (!c.UpdateBlob(Closed(size)).ok()) {
        ADD_FAILURE() << "update " << size;
        return;
      }
    }
  });
  EXPECT_EQ(catalog_->GetBlob(file_.blob)->size, n);
}

TEST_F(DeferredRowsTest, TheLogIsTheDaemonUsersAlone) {
  struct stat st {};
  ASSERT_EQ(::stat(DeferredRows::LogPath(path_).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST_F(DeferredRowsTest, SharedLockingWritesAtOnceAndKeepsNoLog) {
  TempDir other_dir;
  const std::string other = other_dir.path() + "/catalog.db";
  auto c = SqliteCatalog::Open(other, kUid, kGid, 0755, Locking::kShared);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(std::filesystem::exists(DeferredRows::LogPath(other)));
}

}  // namespace
}  // namespace gpufs
