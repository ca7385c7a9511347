// The core without a mount: a real SQLite catalog and a real host store in a
// temporary directory, driven through the Namespace API.
#include "core/namespace.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/control_files.h"
#include "meta/sqlite_catalog.h"
#include "store/host_bulk_store.h"
#include "tests/support/temp_dir.h"

namespace gpufs {
namespace {

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

class NamespaceTest : public ::testing::Test {
 protected:
  void SetUp() override { Reopen(); }
  void TearDown() override { ns_.reset(); }

  // Drops the namespace (as a daemon exit would, open handles included) and
  // opens a new one on the same state.
  void Reopen(uint64_t capacity = 1 << 20) { Start(capacity, {}); }

  // A new worker of the same mount taking over `adopted` handles (the
  // kernel's open files) from the one that died, as the supervisor starts it.
  void TakeOver(std::vector<AdoptedHandle> adopted, std::map<uint64_t, uint64_t> unsealed_sizes) {
    NamespaceOptions options;
    options.adopted = AdoptedState{std::move(adopted), std::move(unsealed_sizes)};
    options.first_handle = 1000;
    Start(1 << 20, std::move(options));
  }

  void Start(uint64_t capacity, NamespaceOptions options) {
    ns_.reset();
    auto catalog = SqliteCatalog::Open(dir_ + "/catalog.db", 0, 0, 0755);
    ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
    auto store = HostBulkStore::Open(dir_ + "/host", capacity);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    host_ = store->get();
    options.catalog = std::move(*catalog);
    options.stores.push_back(std::move(*store));
    auto ns = Namespace::Open(std::move(options));
    ASSERT_TRUE(ns.ok()) << ns.status().ToString();
    ns_ = std::move(*ns);
  }

  uint64_t MkObject(uint64_t parent, const std::string& name) {
    auto attr = ns_->Mkdir(caller_, parent, name, 0755);
    EXPECT_TRUE(attr.ok()) << attr.status().ToString();
    return attr.ok() ? attr->ino : 0;
  }

  // Creates and seals a blob member holding `data`; returns its inode.
  uint64_t PutBlob(uint64_t parent, const std::string& name, const std::string& data) {
    auto created = ns_->Create(caller_, parent, name, 0644, O_WRONLY);
    EXPECT_TRUE(created.ok()) << created.status().ToString();
    if (!created.ok()) return 0;
    auto n = ns_->Write(created->handle, 0, Bytes(data));
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_TRUE(ns_->Release(created->handle).ok());
    return created->attr.ino;
  }

  std::string ReadAll(HandleId h) {
    std::string out;
    std::vector<std::byte> buf(7);  // odd size to exercise offsets
    for (uint64_t off = 0;;) {
      auto n = ns_->Read(h, off, buf);
      EXPECT_TRUE(n.ok()) << n.status().ToString();
      if (!n.ok() || *n == 0) break;
      out.append(reinterpret_cast<const char*>(buf.data()), *n);
      off += *n;
    }
    return out;
  }

  std::string Cat(uint64_t ino) {
    auto h = ns_->Open(caller_, ino, O_RDONLY);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    if (!h.ok()) return "";
    std::string out = ReadAll(h->handle);
    EXPECT_TRUE(ns_->Release(h->handle).ok());
    return out;
  }

  test_support::TempDir tmp_{"gpufs-core"};  // removed after everything below
  std::string dir_ = tmp_.path();
  Caller caller_{1000, 1000, 1, {}};
  std::unique_ptr<Namespace> ns_;
  HostBulkStore* host_ = nullptr;
};

TEST_F(NamespaceTest, WriteSealRead) {
  uint64_t o = MkObject(kRootEntryId, "o");
  uint64_t m = PutBlob(o, "m", "hello gpufs");
  EXPECT_EQ(Cat(m), "hello gpufs");
  auto attr = ns_->Lookup(o, "m");
  ASSERT_TRUE(attr.ok());
  EXPECT_EQ(attr->size, 11u);
  EXPECT_EQ(attr->uid, 1000u);
  EXPECT_TRUE(S_ISREG(attr->mode));
  EXPECT_EQ(host_->Usage().used, 11u);
}

TEST_F(NamespaceTest, SealedBlobRefusesWritesButTruncReplaces) {
  uint64_t m = PutBlob(kRootEntryId, "m", "old bytes");
  auto append = ns_->Open(caller_, m, O_WRONLY | O_APPEND);
  ASSERT_FALSE(append.ok());
  EXPECT_EQ(append.status().code(), EPERM);
  EXPECT_EQ(Cat(m), "old bytes");

  auto reader = ns_->Open(caller_, m, O_RDONLY);
  ASSERT_TRUE(reader.ok());
  auto writer = ns_->Open(caller_, m, O_WRONLY | O_TRUNC);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  ASSERT_TRUE(ns_->Write(writer->handle, 0, Bytes("new")).ok());
  ASSERT_TRUE(ns_->Release(writer->handle).ok());
  EXPECT_EQ(Cat(m), "new");
  EXPECT_EQ(ReadAll(reader->handle), "old bytes");  // the earlier reader keeps its blob
  EXPECT_EQ(host_->Usage().blobs, 2u);
  ASSERT_TRUE(ns_->Release(reader->handle).ok());
  EXPECT_EQ(host_->Usage().blobs, 1u);  // the old blob is freed at its last close
  EXPECT_EQ(host_->Usage().used, 3u);
}

TEST_F(NamespaceTest, ReplacingABlobDropsItsTensorDescription) {
  uint64_t m = PutBlob(kRootEntryId, "m", std::string(16, 'x'));
  ASSERT_TRUE(ns_->SetXattr(m, "user.gpufs.dtype", "float32", 0).ok());
  ASSERT_TRUE(ns_->SetXattr(m, "user.gpufs.shape", "4", 0).ok());
  ASSERT_TRUE(ns_->SetXattr(m, "user.note", "kept", 0).ok());
  auto w = ns_->Open(caller_, m, O_WRONLY | O_TRUNC);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(ns_->Write(w->handle, 0, Bytes("abc")).ok());
  ASSERT_TRUE(ns_->Release(w->handle).ok());
  EXPECT_EQ(ns_->GetXattr(m, "user.gpufs.dtype").status().code(), ENODATA);
  EXPECT_EQ(ns_->GetXattr(m, "user.gpufs.shape").status().code(), ENODATA);
  EXPECT_EQ(*ns_->GetXattr(m, "user.note"), "kept");
}

TEST_F(NamespaceTest, TruncateSealedToZeroReplacesOtherSizesRefused) {
  uint64_t m = PutBlob(kRootEntryId, "m", "abcdef");
  SetAttrRequest shrink;
  shrink.size = 3;
  EXPECT_EQ(ns_->SetAttr(m, shrink, 0).status().code(), EPERM);
  SetAttrRequest zero;
  zero.size = 0;
  auto attr = ns_->SetAttr(m, zero, 0);
  ASSERT_TRUE(attr.ok()) << attr.status().ToString();
  EXPECT_EQ(attr->size, 0u);
  EXPECT_EQ(Cat(m), "");
  EXPECT_EQ(ns_->Open(caller_, m, O_WRONLY).status().code(), EPERM);  // the empty blob is sealed
}

TEST_F(NamespaceTest, UnlinkWhileOpenKeepsBytesUntilRelease) {
  uint64_t m = PutBlob(kRootEntryId, "m", "still here");
  auto reader = ns_->Open(caller_, m, O_RDONLY);
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE(ns_->Unlink(kRootEntryId, "m").ok());
  EXPECT_EQ(ns_->Lookup(kRootEntryId, "m").status().code(), ENOENT);
  auto attr = ns_->GetAttr(m);
  ASSERT_TRUE(attr.ok());
  EXPECT_EQ(attr->nlink, 0u);
  EXPECT_EQ(ReadAll(reader->handle), "still here");
  EXPECT_EQ(host_->Usage().blobs, 1u);
  ASSERT_TRUE(ns_->Release(reader->handle).ok());
  EXPECT_EQ(host_->Usage().blobs, 0u);
  EXPECT_EQ(ns_->GetAttr(m).status().code(), ENOENT);
}

TEST_F(NamespaceTest, RmdirAndUnlinkErrors) {
  uint64_t o = MkObject(kRootEntryId, "o");
  PutBlob(o, "m", "x");
  EXPECT_EQ(ns_->Rmdir(kRootEntryId, "o").code(), ENOTEMPTY);
  EXPECT_EQ(ns_->Unlink(kRootEntryId, "o").code(), EISDIR);
  EXPECT_EQ(ns_->Rmdir(o, "m").code(), ENOTDIR);
  EXPECT_EQ(ns_->Unlink(o, "nope").code(), ENOENT);
  EXPECT_EQ(ns_->Mkdir(caller_, kRootEntryId, "o", 0755).status().code(), EEXIST);
  EXPECT_EQ(ns_->Mkdir(caller_, kRootEntryId, ".gpufs", 0755).status().code(), EEXIST);
  ASSERT_TRUE(ns_->Unlink(o, "m").ok());
  ASSERT_TRUE(ns_->Rmdir(kRootEntryId, "o").ok());
  EXPECT_EQ(host_->Usage().blobs, 0u);
}

TEST_F(NamespaceTest, NameLengthLimit) {
  std::string ok(255, 'a'), too_long(256, 'b');
  EXPECT_NE(PutBlob(kRootEntryId, ok, "x"), 0u);
  EXPECT_TRUE(ns_->Lookup(kRootEntryId, ok).ok());
  EXPECT_EQ(ns_->Create(caller_, kRootEntryId, too_long, 0644, O_WRONLY).status().code(),
            ENAMETOOLONG);
  EXPECT_EQ(ns_->Mkdir(caller_, kRootEntryId, too_long, 0755).status().code(), ENAMETOOLONG);
  EXPECT_EQ(ns_->Lookup(kRootEntryId, too_long).status().code(), ENAMETOOLONG);
}

TEST_F(NamespaceTest, RenameRules) {
  uint64_t a = MkObject(kRootEntryId, "a");
  uint64_t b = MkObject(a, "b");
  PutBlob(kRootEntryId, "x", "xx");
  PutBlob(kRootEntryId, "y", "yyy");
  EXPECT_EQ(ns_->Rename(kRootEntryId, "a", b, "inside", 0).code(), EINVAL);
  EXPECT_EQ(ns_->Rename(kRootEntryId, "x", kRootEntryId, "a", 0).code(), EISDIR);
  EXPECT_EQ(ns_->Rename(kRootEntryId, "a", kRootEntryId, "x", 0).code(), ENOTDIR);
  EXPECT_EQ(ns_->Rename(kRootEntryId, "x", kRootEntryId, "y", RENAME_NOREPLACE).code(), EEXIST);
  EXPECT_EQ(ns_->Rename(kRootEntryId, "x", kRootEntryId, "y", RENAME_EXCHANGE).code(), EINVAL);
  // Onto an existing member: the target's blob is freed.
  ASSERT_TRUE(ns_->Rename(kRootEntryId, "x", kRootEntryId, "y", 0).ok());
  auto y = ns_->Lookup(kRootEntryId, "y");
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(Cat(y->ino), "xx");
  EXPECT_EQ(host_->Usage().blobs, 1u);
  // Into a nested object, and an object onto an empty object.
  ASSERT_TRUE(ns_->Rename(kRootEntryId, "y", b, "z", 0).ok());
  EXPECT_TRUE(ns_->Lookup(b, "z").ok());
  MkObject(kRootEntryId, "empty");
  ASSERT_TRUE(ns_->Rename(kRootEntryId, "a", kRootEntryId, "empty", 0).ok());
  EXPECT_TRUE(ns_->Lookup(kRootEntryId, "empty").ok());
  EXPECT_EQ(ns_->Lookup(kRootEntryId, "a").status().code(), ENOENT);
}

TEST_F(NamespaceTest, ReadDirPagesExactly) {
  for (int i = 0; i < 10; ++i) PutBlob(kRootEntryId, "m" + std::to_string(i), "x");
  std::vector<std::string> names;
  uint64_t cookie = 0;
  while (true) {
    auto page = ns_->ReadDir(kRootEntryId, cookie, 3);
    ASSERT_TRUE(page.ok());
    if (page->empty()) break;
    for (const auto& d : *page) {
      names.push_back(d.name);
      cookie = d.next_cookie;
    }
  }
  ASSERT_EQ(names.size(), 13u);
  EXPECT_EQ(names[0], ".");
  EXPECT_EQ(names[1], "..");
  EXPECT_EQ(names[2], ".gpufs");
  for (int i = 0; i < 10; ++i) EXPECT_EQ(names[3 + i], "m" + std::to_string(i));
}

TEST_F(NamespaceTest, XattrsValidateAndDescribe) {
  uint64_t o = MkObject(kRootEntryId, "o");
  uint64_t m = PutBlob(o, "w", std::string(24, '\0'));
  EXPECT_TRUE(ns_->SetXattr(o, "user.gpufs.type", "Tensor", 0).ok());
  EXPECT_TRUE(ns_->SetXattr(o, "user.origin", "unit test", 0).ok());
  EXPECT_TRUE(ns_->SetXattr(m, "user.gpufs.dtype", "float32", 0).ok());
  EXPECT_TRUE(ns_->SetXattr(m, "user.gpufs.shape", "2,3", 0).ok());
  EXPECT_EQ(ns_->SetXattr(m, "user.gpufs.dtype", "float33", 0).code(), EINVAL);
  EXPECT_EQ(ns_->SetXattr(m, "user.gpufs.shape", "2,x", 0).code(), EINVAL);
  EXPECT_EQ(ns_->SetXattr(m, "user.gpufs.type", "Tensor", 0).code(), EINVAL);
  EXPECT_EQ(ns_->SetXattr(o, "user.gpufs.dtype", "float32", 0).code(), EINVAL);
  EXPECT_EQ(ns_->SetXattr(o, "user.gpufs.bogus", "1", 0).code(), EINVAL);
  EXPECT_EQ(ns_->SetXattr(o, "user.gpufs.meta", "{}", 0).code(), EPERM);
  EXPECT_EQ(ns_->SetXattr(o, "trusted.x", "1", 0).code(), EOPNOTSUPP);
  EXPECT_EQ(ns_->SetXattr(m, "user.gpufs.device", "cuda:0", 0).code(), ENODEV);
  EXPECT_EQ(ns_->SetXattr(m, "user.gpufs.device", "gpu0", 0).code(), EINVAL);
  EXPECT_TRUE(ns_->SetXattr(m, "user.gpufs.device", "host", 0).ok());
  EXPECT_EQ(ns_->GetXattr(m, "user.missing").status().code(), ENODATA);
  // Other namespaces do not exist at all (not "not set"), on the control
  // directory too.
  EXPECT_EQ(ns_->GetXattr(m, "security.selinux").status().code(), EOPNOTSUPP);
  EXPECT_EQ(ns_->GetXattr(o, "system.posix_acl_access").status().code(), EOPNOTSUPP);
  EXPECT_EQ(ns_->GetXattr(m, "trusted.gpufs.disk_copy").status().code(), EOPNOTSUPP);
  EXPECT_EQ(ns_->RemoveXattr(m, "security.selinux").code(), EOPNOTSUPP);
  EXPECT_EQ(ns_->GetXattr(kControlDirIno, "security.selinux").status().code(), EOPNOTSUPP);
  EXPECT_EQ(ns_->GetXattr(kControlDirIno, "user.x").status().code(), ENODATA);
  EXPECT_EQ(ns_->GetXattr(m, "user.gpufs.ipc_handle").status().code(), ENODATA);
  EXPECT_EQ(*ns_->GetXattr(m, "user.gpufs.device"), "host");
  EXPECT_EQ(*ns_->GetXattr(o, "user.gpufs.device"), "host");

  auto meta = ns_->GetXattr(o, "user.gpufs.meta");
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  auto j = nlohmann::json::parse(*meta);
  EXPECT_EQ(j["typename"], "Tensor");
  EXPECT_EQ(j["fields"]["origin"], "unit test");
  EXPECT_EQ(j["members"]["w"]["dtype"], "float32");
  EXPECT_EQ(j["members"]["w"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(j["members"]["w"]["size"], 24);
  EXPECT_EQ(j["members"]["w"]["state"], "sealed");

  auto names = ns_->ListXattr(o);
  ASSERT_TRUE(names.ok());
  EXPECT_NE(std::find(names->begin(), names->end(), "user.gpufs.type"), names->end());
  EXPECT_NE(std::find(names->begin(), names->end(), "user.origin"), names->end());
  EXPECT_TRUE(ns_->RemoveXattr(o, "user.origin").ok());
  EXPECT_EQ(ns_->RemoveXattr(o, "user.origin").code(), ENODATA);
  EXPECT_EQ(ns_->RemoveXattr(o, "user.gpufs.meta").code(), EPERM);
}

TEST_F(NamespaceTest, OutOfSpaceDiscardsTheHalfWrittenBlob) {
  Reopen(/*capacity=*/4096);
  PutBlob(kRootEntryId, "small", std::string(1000, 's'));
  auto created = ns_->Create(caller_, kRootEntryId, "big", 0644, O_WRONLY);
  ASSERT_TRUE(created.ok());
  ASSERT_TRUE(ns_->Write(created->handle, 0, Bytes(std::string(2000, 'b'))).ok());
  auto full = ns_->Write(created->handle, 2000, Bytes(std::string(2000, 'b')));
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), ENOSPC);
  // Every later write and the flush say why (as sendfile's and splice's
  // later pieces must), and the member is gone once the flush returned.
  EXPECT_EQ(ns_->Write(created->handle, 2000, Bytes("b")).status().code(), ENOSPC);
  EXPECT_EQ(ns_->Flush(created->handle).code(), ENOSPC);
  EXPECT_EQ(ns_->Lookup(kRootEntryId, "big").status().code(), ENOENT);
  EXPECT_FALSE(ns_->Release(created->handle).ok());
  EXPECT_EQ(ns_->Lookup(kRootEntryId, "big").status().code(), ENOENT);
  EXPECT_EQ(host_->Usage().used, 1000u);
  // The store keeps working.
  uint64_t again = PutBlob(kRootEntryId, "again", std::string(3000, 'a'));
  EXPECT_EQ(Cat(again), std::string(3000, 'a'));
}

TEST_F(NamespaceTest, RestartSweepsUnsealedAndDetached) {
  uint64_t kept = PutBlob(kRootEntryId, "kept", "durable");
  ASSERT_TRUE(ns_->SetXattr(kept, "user.note", "n", 0).ok());
  auto half = ns_->Create(caller_, kRootEntryId, "half", 0644, O_WRONLY);
  ASSERT_TRUE(half.ok());
  ASSERT_TRUE(ns_->Write(half->handle, 0, Bytes("partial")).ok());
  uint64_t gone = PutBlob(kRootEntryId, "gone", "unlinked but open");
  auto reader = ns_->Open(caller_, gone, O_RDONLY);
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE(ns_->Unlink(kRootEntryId, "gone").ok());
  uint64_t generation = ns_->generation();

  Reopen();  // as after kill -9: the handles above are never released
  EXPECT_EQ(ns_->generation(), generation + 1);
  EXPECT_EQ(Cat(kept), "durable");
  EXPECT_EQ(*ns_->GetXattr(kept, "user.note"), "n");
  EXPECT_EQ(ns_->Lookup(kRootEntryId, "half").status().code(), ENOENT);
  EXPECT_EQ(ns_->GetAttr(gone).status().code(), ENOENT);
  EXPECT_EQ(host_->Usage().blobs, 1u);
  EXPECT_EQ(host_->Usage().used, 7u);
}

// A close() that returned (Flush) is durable: the restart seals the member.
// A write after that close (through a duplicate) takes the mark back.
TEST_F(NamespaceTest, RestartSealsWhatAWritersCloseRecorded) {
  auto closed = ns_->Create(caller_, kRootEntryId, "closed", 0644, O_WRONLY);
  ASSERT_TRUE(closed.ok());
  ASSERT_TRUE(ns_->Write(closed->handle, 0, Bytes("complete")).ok());
  ASSERT_TRUE(ns_->Flush(closed->handle).ok());
  auto reopened = ns_->Create(caller_, kRootEntryId, "reopened", 0644, O_WRONLY);
  ASSERT_TRUE(reopened.ok());
  ASSERT_TRUE(ns_->Write(reopened->handle, 0, Bytes("first")).ok());
  ASSERT_TRUE(ns_->Flush(reopened->handle).ok());
  ASSERT_TRUE(ns_->Write(reopened->handle, 5, Bytes(" and more")).ok());  // a dup writes on

  Reopen();  // as after kill -9 right after close(): no release ever came
  auto m = ns_->Lookup(kRootEntryId, "closed");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(Cat(m->ino), "complete");
  EXPECT_EQ(ns_->Open(caller_, m->ino, O_WRONLY).status().code(), EPERM);  // sealed
  EXPECT_EQ(ns_->Lookup(kRootEntryId, "reopened").status().code(), ENOENT);
}

// A worker that took over a writer's handle after its close() was recorded
// takes the mark back at the next write, like the worker that recorded it:
// killed after that write, the member is discarded, never sealed half-written.
TEST_F(NamespaceTest, TakenOverWriterTakesTheCloseMarkBackAtItsNextWrite) {
  auto w = ns_->Create(caller_, kRootEntryId, "m", 0644, O_WRONLY);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(ns_->Write(w->handle, 0, Bytes("first")).ok());
  ASSERT_TRUE(ns_->Flush(w->handle).ok());  // one descriptor closed: recorded

  TakeOver({AdoptedHandle{w->handle, w->attr.ino, w->blob, /*writable=*/true}}, {{w->blob, 5}});
  ASSERT_TRUE(ns_->Write(w->handle, 5, Bytes(" and more")).ok());  // a dup writes on

  Reopen();  // the new worker is killed before any close
  EXPECT_EQ(ns_->Lookup(kRootEntryId, "m").status().code(), ENOENT);
}

TEST_F(NamespaceTest, LostBytesGiveEio) {
  uint64_t m = PutBlob(kRootEntryId, "m", "will vanish");
  for (const auto& file : std::filesystem::directory_iterator(dir_ + "/host")) {
    std::filesystem::remove(file.path());
  }
  Reopen();
  auto h = ns_->Open(caller_, m, O_RDONLY);
  ASSERT_TRUE(h.ok());
  std::vector<std::byte> buf(16);
  EXPECT_EQ(ns_->Read(h->handle, 0, buf).status().code(), EIO);
  ASSERT_TRUE(ns_->Release(h->handle).ok());
  auto j = nlohmann::json::parse(*ns_->GetXattr(m, "user.gpufs.meta"));
  EXPECT_EQ(j["state"], "lost");
  // Replacing it with O_TRUNC brings it back.
  auto w = ns_->Open(caller_, m, O_WRONLY | O_TRUNC);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(ns_->Write(w->handle, 0, Bytes("fresh")).ok());
  ASSERT_TRUE(ns_->Release(w->handle).ok());
  EXPECT_EQ(Cat(m), "fresh");
}

TEST_F(NamespaceTest, StatsAndStatFs) {
  PutBlob(kRootEntryId, "m", "1234");
  auto j = nlohmann::json::parse(ns_->StatsJson());
  ASSERT_EQ(j["devices"].size(), 1u);
  EXPECT_EQ(j["devices"][0]["device"], "host");
  EXPECT_EQ(j["devices"][0]["capacity"], 1 << 20);
  EXPECT_EQ(j["devices"][0]["used"], 4);
  EXPECT_EQ(j["devices"][0]["blobs"], 1);
  FsStats st = ns_->StatFs();
  EXPECT_EQ(st.capacity, 1u << 20);
  EXPECT_EQ(st.free, (1u << 20) - 4);
  EXPECT_EQ(st.entries, 2u);
  auto h = ns_->Open(caller_, kStatsIno, O_RDONLY);
  ASSERT_TRUE(h.ok());
  EXPECT_FALSE(nlohmann::json::parse(ReadAll(h->handle), nullptr, false).is_discarded());
  ASSERT_TRUE(ns_->Release(h->handle).ok());
  EXPECT_EQ(ns_->Open(caller_, kStatsIno, O_WRONLY).status().code(), EPERM);
}

TEST_F(NamespaceTest, AppendHandleWritesAtTheEnd) {
  auto created = ns_->Create(caller_, kRootEntryId, "log", 0644, O_WRONLY | O_APPEND);
  ASSERT_TRUE(created.ok());
  ASSERT_TRUE(ns_->Write(created->handle, 0, Bytes("ab")).ok());
  ASSERT_TRUE(ns_->Write(created->handle, 0, Bytes("cd")).ok());
  ASSERT_TRUE(ns_->Release(created->handle).ok());
  EXPECT_EQ(Cat(created->attr.ino), "abcd");
}

}  // namespace
}  // namespace gpufs
