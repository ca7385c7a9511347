/* gpufs-fs-probe: the per-call timings of bench/fs_bench.sh, on any
 * directory. Prints one number: microseconds per operation.
 *
 *   gpufs-fs-probe roundtrip FILE N IDLE_MS  open + fstat + ioctl(GPUFS_IOC_MAP)
 *                                            + close, N times, IDLE_MS between;
 *                                            the median (an ioctl error such
 *                                            as ENODEV on a host blob is a
 *                                            completed round trip too)
 *   gpufs-fs-probe negstat DIR N             stat of N distinct missing names
 *                                            in DIR; the mean
 *   gpufs-fs-probe statfs PATH N             statfs(PATH) N times; the mean
 *   gpufs-fs-probe readfile PATH N           open + read all + close; the mean
 *
 * Where a file system's per-call time goes, one syscall at a time (one line
 * per call: its median over N, microseconds), to compare gpufs with minifs
 * and tmpfs call by call:
 *
 *   gpufs-fs-probe steps-open FILE N     open, fstat, ioctl(GPUFS_IOC_MAP),
 *                                        fgetxattr of a missing name, close
 *   gpufs-fs-probe steps-create DIR N    open(O_CREAT|O_WRONLY|O_TRUNC) of a
 *                                        new name, close, stat, unlink
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "gpufs/uapi.h"

static double NowUs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int CompareDoubles(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static int Fail(const char* what) {
  fprintf(stderr, "gpufs-fs-probe: %s: %s\n", what, strerror(errno));
  return 1;
}

static int RoundTrip(const char* path, long n, long idle_ms) {
  double* us = calloc((size_t)n, sizeof *us);
  if (us == NULL) return Fail("calloc");
  for (long i = 0; i < n; ++i) {
    if (idle_ms > 0) {
      struct timespec idle = {idle_ms / 1000, (idle_ms % 1000) * 1000000L};
      nanosleep(&idle, NULL); /* the idle time being measured, not a wait */
    }
    double t0 = NowUs();
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Fail(path);
    struct stat st;
    if (fstat(fd, &st) != 0) return Fail("fstat");
    struct gpufs_ipc_info info;
    if (ioctl(fd, GPUFS_IOC_MAP, &info) != 0 && errno != ENODEV && errno != ENOTTY) {
      return Fail("ioctl");
    }
    close(fd);
    us[i] = NowUs() - t0;
  }
  qsort(us, (size_t)n, sizeof *us, CompareDoubles);
  printf("%.1f\n", us[n / 2]);
  free(us);
  return 0;
}

enum { kMaxSteps = 5 };

static void PrintSteps(const char* const* names, double** us, int steps, long n) {
  for (int s = 0; s < steps; ++s) {
    qsort(us[s], (size_t)n, sizeof(double), CompareDoubles);
    printf("%-10s %8.1f us\n", names[s], us[s][n / 2]);
  }
}

static int StepsOpen(const char* path, long n, double** us) {
  static const char* const kNames[] = {"open", "fstat", "ioctl", "fgetxattr", "close"};
  for (long i = 0; i < n; ++i) {
    double t0 = NowUs();
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Fail(path);
    double t1 = NowUs();
    struct stat st;
    if (fstat(fd, &st) != 0) return Fail("fstat");
    double t2 = NowUs();
    struct gpufs_ipc_info info;
    if (ioctl(fd, GPUFS_IOC_MAP, &info) != 0 && errno != ENODEV && errno != ENOTTY &&
        errno != EINVAL) {
      return Fail("ioctl");
    }
    double t3 = NowUs();
    char value[64];
    if (fgetxattr(fd, "user.fs-probe-missing", value, sizeof value) >= 0) {
      errno = EEXIST;
      return Fail("fgetxattr of a missing name");
    }
    double t4 = NowUs();
    close(fd);
    double t5 = NowUs();
    us[0][i] = t1 - t0, us[1][i] = t2 - t1, us[2][i] = t3 - t2, us[3][i] = t4 - t3;
    us[4][i] = t5 - t4;
  }
  PrintSteps(kNames, us, 5, n);
  return 0;
}

static int StepsCreate(const char* dir, long n, double** us) {
  static const char* const kNames[] = {"create", "close", "stat", "unlink"};
  for (long i = 0; i < n; ++i) {
    char name[4096];
    snprintf(name, sizeof name, "%s/fs-probe-%ld-%d", dir, i, (int)getpid());
    double t0 = NowUs();
    int fd = open(name, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Fail(name);
    double t1 = NowUs();
    close(fd);
    double t2 = NowUs();
    struct stat st;
    if (stat(name, &st) != 0) return Fail("stat");
    double t3 = NowUs();
    if (unlink(name) != 0) return Fail("unlink");
    double t4 = NowUs();
    us[0][i] = t1 - t0, us[1][i] = t2 - t1, us[2][i] = t3 - t2, us[3][i] = t4 - t3;
  }
  PrintSteps(kNames, us, 4, n);
  return 0;
}

static int Steps(const char* mode, const char* path, long n) {
  double* us[kMaxSteps];
  for (int s = 0; s < kMaxSteps; ++s) {
    us[s] = calloc((size_t)n, sizeof(double));
    if (us[s] == NULL) return Fail("calloc");
  }
  int rc = strcmp(mode, "steps-open") == 0 ? StepsOpen(path, n, us) : StepsCreate(path, n, us);
  for (int s = 0; s < kMaxSteps; ++s) free(us[s]);
  return rc;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: see the comment at the top of bench/fs_probe.c\n");
    return 2;
  }
  const char* mode = argv[1];
  const char* path = argv[2];
  long n = atol(argv[3]);
  if (n <= 0) n = 1;
  if (strcmp(mode, "roundtrip") == 0) return RoundTrip(path, n, argc > 4 ? atol(argv[4]) : 0);
  if (strcmp(mode, "steps-open") == 0 || strcmp(mode, "steps-create") == 0) {
    return Steps(mode, path, n);
  }

  double t0 = NowUs();
  for (long i = 0; i < n; ++i) {
    if (strcmp(mode, "negstat") == 0) {
      char name[4096];
      snprintf(name, sizeof name, "%s/missing-%ld-%d", path, i, (int)getpid());
      struct stat st;
      if (stat(name, &st) == 0 || errno != ENOENT) return Fail("negstat: expected ENOENT");
    } else if (strcmp(mode, "statfs") == 0) {
      struct statfs st;
      if (statfs(path, &st) != 0) return Fail(path);
    } else if (strcmp(mode, "readfile") == 0) {
      char buf[65536];
      int fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) return Fail(path);
      ssize_t got;
      while ((got = read(fd, buf, sizeof buf)) > 0) {
      }
      if (got < 0) return Fail("read");
      close(fd);
    } else {
      fprintf(stderr, "gpufs-fs-probe: unknown mode %s\n", mode);
      return 2;
    }
  }
  printf("%.2f\n", (NowUs() - t0) / (double)n);
  return 0;
}
