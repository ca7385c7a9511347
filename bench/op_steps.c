/* gpufs-op-steps: where a file system's per-call time goes, one syscall at a
 * time (medians of N, microseconds), to compare gpufs with minifs and tmpfs
 * call by call on the same machine.
 *
 *   gpufs-op-steps open FILE N    open, fstat, ioctl(GPUFS_IOC_MAP),
 *                                 fgetxattr of a missing name, close
 *   gpufs-op-steps create DIR N   open(O_CREAT|O_WRONLY|O_TRUNC) of a new
 *                                 name, close, stat, unlink
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "gpufs/uapi.h"

enum { kMaxSteps = 5 };

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
  fprintf(stderr, "gpufs-op-steps: %s: %s\n", what, strerror(errno));
  return 1;
}

static void Print(const char* const* names, double** us, int steps, long n) {
  for (int s = 0; s < steps; ++s) {
    qsort(us[s], (size_t)n, sizeof(double), CompareDoubles);
    printf("%-10s %8.1f us\n", names[s], us[s][n / 2]);
  }
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: see the comment at the top of bench/op_steps.c\n");
    return 2;
  }
  const char* mode = argv[1];
  const char* path = argv[2];
  long n = atol(argv[3]);
  if (n <= 0) n = 1;
  double* us[kMaxSteps];
  for (int s = 0; s < kMaxSteps; ++s) {
    us[s] = calloc((size_t)n, sizeof(double));
    if (us[s] == NULL) return Fail("calloc");
  }
  if (strcmp(mode, "open") == 0) {
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
      if (fgetxattr(fd, "user.op-steps-missing", value, sizeof value) >= 0) {
        return Fail("fgetxattr of a missing name succeeded");
      }
      double t4 = NowUs();
      close(fd);
      double t5 = NowUs();
      us[0][i] = t1 - t0, us[1][i] = t2 - t1, us[2][i] = t3 - t2, us[3][i] = t4 - t3;
      us[4][i] = t5 - t4;
    }
    Print(kNames, us, 5, n);
  } else if (strcmp(mode, "create") == 0) {
    static const char* const kNames[] = {"create", "close", "stat", "unlink"};
    for (long i = 0; i < n; ++i) {
      char name[4096];
      snprintf(name, sizeof name, "%s/op-steps-%ld-%d", path, i, (int)getpid());
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
    Print(kNames, us, 4, n);
  } else {
    fprintf(stderr, "gpufs-op-steps: unknown mode %s\n", mode);
    return 2;
  }
  return 0;
}
