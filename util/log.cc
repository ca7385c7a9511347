#include "util/log.h"

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace gpufs::log {
namespace {

Level InitialLevel() {
  const char* env = std::getenv("GPUFS_LOG_LEVEL");
  if (env == nullptr) return Level::INFO;
  if (std::strcmp(env, "debug") == 0) return Level::DEBUG;
  if (std::strcmp(env, "warn") == 0) return Level::WARN;
  if (std::strcmp(env, "error") == 0) return Level::ERROR;
  return Level::INFO;
}

std::atomic<int> g_level{static_cast<int>(InitialLevel())};
std::atomic<int> g_fd{2};

}  // namespace

void SetLevel(Level level) { g_level = static_cast<int>(level); }
Level GetLevel() { return static_cast<Level>(g_level.load()); }
void SetFd(int fd) { g_fd = fd; }

void Write(Level level, const std::string& message) {
  timeval tv{};
  gettimeofday(&tv, nullptr);
  tm utc{};
  gmtime_r(&tv.tv_sec, &utc);
  char stamp[64];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &utc);
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E'};
  std::string line;
  line.reserve(message.size() + 64);
  line += stamp;
  char millis[8];
  std::snprintf(millis, sizeof millis, ".%03dZ ", static_cast<int>(tv.tv_usec / 1000));
  line += millis;
  line += kLetters[static_cast<int>(level)];
  line += " gpufs[" + std::to_string(getpid()) + "] ";
  line += message;
  line += '\n';
  ssize_t ignored = ::write(g_fd.load(), line.data(), line.size());
  (void)ignored;
}

}  // namespace gpufs::log
