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
