// gpufs-minifs: the "minimal libfuse file system" that bench/fs_bench.sh
// measures gpufs against. A passthrough of a backing directory written the way
// libfuse's passthrough_ll does it, with nothing else in the path: inodes are
// looked up by (st_dev, st_ino), each request is one syscall on them (a
// directory keeps an O_PATH fd; a file is its directory's fd and its name, so
// 20k files fit under the container's 20000-fd limit), and the data path is the same as gpufs's (direct_io, 1 MiB requests,
// a page-aligned per-thread buffer), so a ratio against it is what gpufs's own
// work costs. Any ioctl is answered with zeroed output of the size asked for,
// so open + ioctl round trips can be compared with GPUFS_IOC_MAP.
//
//   gpufs-minifs BACKING_DIR MOUNTPOINT [--timeout SECONDS] [-f]
//
// Entry and attribute timeouts: 1 s unless --timeout says otherwise.
// Not for production use: no permission checks beyond the backing files'.
#define FUSE_USE_VERSION 312
#include <dirent.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace {

constexpr size_t kMaxIo = 1u << 20;

struct Inode {
  int fd = -1;  // O_PATH, directories only
  dev_t dev = 0;
  ino_t ino = 0;
  uint64_t nlookup = 0;     // guarded by g_mu
  struct Inode* parent = nullptr;  // files: where they are (directories are never freed)
  std::string name;         // guarded by g_mu
};

std::mutex g_mu;
std::map<std::pair<dev_t, ino_t>, Inode*> g_inodes;  // guarded by g_mu
Inode g_root;
double g_timeout = 1.0;

Inode& In(fuse_ino_t ino) {
  return ino == FUSE_ROOT_ID ? g_root : *reinterpret_cast<Inode*>(ino);
}

std::string ProcPath(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

// The directory fd and name to reach `inode` with *at() calls.
std::pair<int, std::string> At(fuse_ino_t ino) {
  Inode& inode = ino == FUSE_ROOT_ID ? g_root : *reinterpret_cast<Inode*>(ino);
  if (inode.fd >= 0) return {inode.fd, ""};
  std::lock_guard lock(g_mu);
  return {inode.parent->fd, inode.name};
}

int StatOf(fuse_ino_t ino, struct stat* st) {
  auto [fd, name] = At(ino);
  return fstatat(fd, name.c_str(), st, AT_SYMLINK_NOFOLLOW | (name.empty() ? AT_EMPTY_PATH : 0));
}

// Looks `name` up under `parent`, counting one kernel lookup.
int DoLookup(fuse_ino_t parent, const char* name, fuse_entry_param* e) {
  *e = fuse_entry_param{};
  e->attr_timeout = g_timeout;
  e->entry_timeout = g_timeout;
  if (fstatat(In(parent).fd, name, &e->attr, AT_SYMLINK_NOFOLLOW) != 0) return errno;
  int fd = -1;
  if (S_ISDIR(e->attr.st_mode)) {
    fd = openat(In(parent).fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return errno;
  }
  std::lock_guard lock(g_mu);
  auto key = std::make_pair(e->attr.st_dev, e->attr.st_ino);
  Inode*& inode = g_inodes[key];
  if (inode != nullptr) {
    if (fd >= 0) close(fd);
  } else {
    inode = new Inode{fd, e->attr.st_dev, e->attr.st_ino, 0, &In(parent), name};
  }
  inode->nlookup++;
  e->ino = reinterpret_cast<fuse_ino_t>(inode);
  return 0;
}

void Forget(fuse_ino_t ino, uint64_t n) {
  if (ino == FUSE_ROOT_ID) return;
  std::lock_guard lock(g_mu);
  Inode& inode = In(ino);
  inode.nlookup -= std::min(n, inode.nlookup);
  if (inode.nlookup == 0 && inode.fd < 0) {  // files only: children point at directories
    g_inodes.erase({inode.dev, inode.ino});
    delete &inode;
  }
}

void OnLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_entry_param e;
  int err = DoLookup(parent, name, &e);
  if (err != 0) {
    fuse_reply_err(req, err);
  } else {
    fuse_reply_entry(req, &e);
  }
}

void OnForget(fuse_req_t req, fuse_ino_t ino, uint64_t n) {
  Forget(ino, n);
  fuse_reply_none(req);
}

void OnForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; ++i) Forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void OnGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  struct stat st;
  if (StatOf(ino, &st) != 0) {
    return static_cast<void>(fuse_reply_err(req, errno));
  }
  fuse_reply_attr(req, &st, g_timeout);
}

void OnSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
               fuse_file_info* fi) {
  auto [dir_fd, name] = At(ino);
  const std::string path = name.empty() ? ProcPath(dir_fd) : ProcPath(dir_fd) + "/" + name;
  int rc = 0;
  if (to_set & FUSE_SET_ATTR_MODE) rc = chmod(path.c_str(), attr->st_mode);
  if (rc == 0 && (to_set & FUSE_SET_ATTR_SIZE)) {
    rc = fi != nullptr ? ftruncate(static_cast<int>(fi->fh), attr->st_size)
                       : truncate(path.c_str(), attr->st_size);
  }
  if (rc == 0 && (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_ATIME_NOW |
                            FUSE_SET_ATTR_MTIME_NOW))) {
    timespec tv[2] = {{0, UTIME_OMIT}, {0, UTIME_OMIT}};
    if (to_set & FUSE_SET_ATTR_ATIME) tv[0] = attr->st_atim;
    if (to_set & FUSE_SET_ATTR_MTIME) tv[1] = attr->st_mtim;
    if (to_set & FUSE_SET_ATTR_ATIME_NOW) tv[0].tv_nsec = UTIME_NOW;
    if (to_set & FUSE_SET_ATTR_MTIME_NOW) tv[1].tv_nsec = UTIME_NOW;
    rc = utimensat(AT_FDCWD, path.c_str(), tv, 0);
  }
  if (rc != 0) return static_cast<void>(fuse_reply_err(req, errno));
  OnGetattr(req, ino, fi);
}

void ReplyNewEntry(fuse_req_t req, fuse_ino_t parent, const char* name, int rc) {
  if (rc != 0) return static_cast<void>(fuse_reply_err(req, errno));
  OnLookup(req, parent, name);
}

void OnMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  ReplyNewEntry(req, parent, name, mkdirat(In(parent).fd, name, mode));
}

void OnMknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  ReplyNewEntry(req, parent, name, mknodat(In(parent).fd, name, mode, rdev));
}

void OnUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_reply_err(req, unlinkat(In(parent).fd, name, 0) == 0 ? 0 : errno);
}

void OnRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_reply_err(req, unlinkat(In(parent).fd, name, AT_REMOVEDIR) == 0 ? 0 : errno);
}

void OnRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent,
              const char* new_name, unsigned flags) {
  if (flags != 0) return static_cast<void>(fuse_reply_err(req, EINVAL));
  struct stat st;
  if (fstatat(In(parent).fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return static_cast<void>(fuse_reply_err(req, errno));
  }
  if (renameat(In(parent).fd, name, In(new_parent).fd, new_name) != 0) {
    return static_cast<void>(fuse_reply_err(req, errno));
  }
  {
    std::lock_guard lock(g_mu);
    auto it = g_inodes.find({st.st_dev, st.st_ino});
    if (it != g_inodes.end()) {
      it->second->parent = &In(new_parent);
      it->second->name = new_name;
    }
  }
  fuse_reply_err(req, 0);
}

void OnCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
              fuse_file_info* fi) {
  int fd = openat(In(parent).fd, name, (fi->flags | O_CREAT | O_CLOEXEC) & ~O_NOFOLLOW, mode);
  if (fd < 0) return static_cast<void>(fuse_reply_err(req, errno));
  fuse_entry_param e;
  int err = DoLookup(parent, name, &e);
  if (err != 0) {
    close(fd);
    return static_cast<void>(fuse_reply_err(req, err));
  }
  fi->fh = static_cast<uint64_t>(fd);
  fi->direct_io = 1;
  fuse_reply_create(req, &e, fi);
}

void OnOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto [dir_fd, name] = At(ino);
  int fd = openat(dir_fd, name.empty() ? "." : name.c_str(), (fi->flags & ~O_NOFOLLOW) | O_CLOEXEC);
  if (fd < 0) return static_cast<void>(fuse_reply_err(req, errno));
  fi->fh = static_cast<uint64_t>(fd);
  fi->direct_io = 1;
  fuse_reply_open(req, fi);
}

void OnRead(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  thread_local void* buf = mmap(nullptr, kMaxIo, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED || size > kMaxIo) return static_cast<void>(fuse_reply_err(req, ENOMEM));
  ssize_t n = pread(static_cast<int>(fi->fh), buf, size, off);
  if (n < 0) return static_cast<void>(fuse_reply_err(req, errno));
  fuse_reply_buf(req, static_cast<const char*>(buf), static_cast<size_t>(n));
}

void OnWrite(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t off,
             fuse_file_info* fi) {
  ssize_t n = pwrite(static_cast<int>(fi->fh), buf, size, off);
  if (n < 0) return static_cast<void>(fuse_reply_err(req, errno));
  fuse_reply_write(req, static_cast<size_t>(n));
}

void OnFlush(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

void OnRelease(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  close(static_cast<int>(fi->fh));
  fuse_reply_err(req, 0);
}

void OnOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  int fd = openat(In(ino).fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR* dir = fd >= 0 ? fdopendir(fd) : nullptr;
  if (dir == nullptr) {
    int err = errno;
    if (fd >= 0) close(fd);
    return static_cast<void>(fuse_reply_err(req, err));
  }
  fi->fh = reinterpret_cast<uint64_t>(dir);
  fuse_reply_open(req, fi);
}

// Readdir and readdirplus; the plus form looks each entry up (as the kernel
// expects: it counts one lookup per returned entry other than . and ..).
void DoReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi,
               bool plus) {
  DIR* dir = reinterpret_cast<DIR*>(fi->fh);
  char* buf = static_cast<char*>(malloc(size));
  if (buf == nullptr) return static_cast<void>(fuse_reply_err(req, ENOMEM));
  seekdir(dir, off);
  size_t used = 0;
  for (;;) {
    long pos = telldir(dir);
    errno = 0;
    dirent* d = readdir(dir);
    if (d == nullptr) break;
    size_t need;
    bool dots = strcmp(d->d_name, ".") == 0 || strcmp(d->d_name, "..") == 0;
    if (plus) {
      fuse_entry_param e{};
      if (dots) {
        e.attr.st_ino = d->d_ino;
        e.attr.st_mode = static_cast<mode_t>(d->d_type) << 12;
      } else if (DoLookup(ino, d->d_name, &e) != 0) {
        continue;
      }
      need = fuse_add_direntry_plus(req, buf + used, size - used, d->d_name, &e, telldir(dir));
      if (need > size - used) {
        if (!dots) Forget(e.ino, 1);
        seekdir(dir, pos);
        break;
      }
    } else {
      struct stat st{};
      st.st_ino = d->d_ino;
      st.st_mode = static_cast<mode_t>(d->d_type) << 12;
      need = fuse_add_direntry(req, buf + used, size - used, d->d_name, &st, telldir(dir));
      if (need > size - used) break;
    }
    used += need;
  }
  fuse_reply_buf(req, buf, used);
  free(buf);
}

void OnReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  DoReaddir(req, ino, size, off, fi, false);
}

void OnReaddirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  DoReaddir(req, ino, size, off, fi, true);
}

void OnReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  closedir(reinterpret_cast<DIR*>(fi->fh));
  fuse_reply_err(req, 0);
}

void OnStatfs(fuse_req_t req, fuse_ino_t ino) {
  struct statvfs st;
  (void)ino;
  if (fstatvfs(g_root.fd, &st) != 0) return static_cast<void>(fuse_reply_err(req, errno));
  fuse_reply_statfs(req, &st);
}

// Extended attributes pass through too, so tools that probe them (ls -l asks
// for security.selinux of every file) pay the same round trips as on gpufs.
std::string PathOfInode(fuse_ino_t ino) {
  auto [dir_fd, name] = At(ino);
  return name.empty() ? ProcPath(dir_fd) : ProcPath(dir_fd) + "/" + name;
}

void OnGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  char buf[65536];
  ssize_t n = getxattr(PathOfInode(ino).c_str(), name, size == 0 ? nullptr : buf,
                        std::min(size, sizeof buf));
  if (n < 0) return static_cast<void>(fuse_reply_err(req, errno));
  if (size == 0) return static_cast<void>(fuse_reply_xattr(req, static_cast<size_t>(n)));
  fuse_reply_buf(req, buf, static_cast<size_t>(n));
}

void OnListxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  char buf[65536];
  ssize_t n = listxattr(PathOfInode(ino).c_str(), size == 0 ? nullptr : buf,
                         std::min(size, sizeof buf));
  if (n < 0) return static_cast<void>(fuse_reply_err(req, errno));
  if (size == 0) return static_cast<void>(fuse_reply_xattr(req, static_cast<size_t>(n)));
  fuse_reply_buf(req, buf, static_cast<size_t>(n));
}

void OnSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                int flags) {
  int rc = setxattr(PathOfInode(ino).c_str(), name, value, size, flags);
  fuse_reply_err(req, rc == 0 ? 0 : errno);
}

void OnIoctl(fuse_req_t req, fuse_ino_t, unsigned int, void*, fuse_file_info*, unsigned flags,
             const void*, size_t, size_t out_bufsz) {
  if (flags & FUSE_IOCTL_COMPAT) return static_cast<void>(fuse_reply_err(req, ENOSYS));
  char out[4096] = {};
  fuse_reply_ioctl(req, 0, out, std::min(out_bufsz, sizeof out));
}

void OnInit(void*, fuse_conn_info* conn) {
  if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
  conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
  conn->max_write = kMaxIo;
  conn->max_readahead = kMaxIo;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s BACKING_DIR MOUNTPOINT [--timeout SECONDS] [-f]\n", argv[0]);
    return 2;
  }
  bool foreground = false;
  for (int i = 3; i < argc; ++i) {
    if (std::strcmp(argv[i], "-f") == 0) {
      foreground = true;
    } else if (std::strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) {
      g_timeout = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "%s: unknown argument %s\n", argv[0], argv[i]);
      return 2;
    }
  }
  // One O_PATH fd per inode the kernel knows, as passthrough_ll keeps.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
    rlimit more{1u << 20, 1u << 20};  // root may raise the hard limit
    files.rlim_cur = files.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &more) != 0) setrlimit(RLIMIT_NOFILE, &files);
  }
  g_root.fd = open(argv[1], O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (g_root.fd < 0) {
    std::perror(argv[1]);
    return 1;
  }
  fuse_lowlevel_ops ops{};
  ops.init = OnInit;
  ops.lookup = OnLookup;
  ops.forget = OnForget;
  ops.forget_multi = OnForgetMulti;
  ops.getattr = OnGetattr;
  ops.setattr = OnSetattr;
  ops.mkdir = OnMkdir;
  ops.mknod = OnMknod;
  ops.unlink = OnUnlink;
  ops.rmdir = OnRmdir;
  ops.rename = OnRename;
  ops.create = OnCreate;
  ops.open = OnOpen;
  ops.read = OnRead;
  ops.write = OnWrite;
  ops.flush = OnFlush;
  ops.release = OnRelease;
  ops.opendir = OnOpendir;
  ops.readdir = OnReaddir;
  ops.readdirplus = OnReaddirplus;
  ops.releasedir = OnReleasedir;
  ops.statfs = OnStatfs;
  ops.ioctl = OnIoctl;
  ops.getxattr = OnGetxattr;
  ops.listxattr = OnListxattr;
  ops.setxattr = OnSetxattr;

  char name[] = "gpufs-minifs";
  char opt_flag[] = "-o";
  char opts[] = "fsname=minifs,subtype=minifs,default_permissions";
  char* fargv[] = {name, opt_flag, opts};
  fuse_args args = FUSE_ARGS_INIT(3, fargv);
  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, nullptr);
  if (se == nullptr) return 1;
  if (fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, argv[2]) != 0) return 1;
  if (!foreground && fuse_daemonize(0) != 0) return 1;
  fuse_loop_config* config = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(config, 16);
  int rc = fuse_session_loop_mt(se, config);
  fuse_loop_cfg_destroy(config);
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  return rc == 0 ? 0 : 1;
}
