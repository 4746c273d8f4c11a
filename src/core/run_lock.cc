// The run directory's lock: flock(2) on RUN/.lock, exclusive while the first holder writes its
// name into the file, then shared with the processes of the same job.
#include "core/run_lock.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/host.h"
#include "core/timer.h"

namespace tessera {
namespace {

// The holder's line: "job=ID host=H pid=P started=T" (no token: ID is public).
std::string holder_line(const std::string& job) {
  return fmt::format("job={} host={} pid={} started={}\n", job, host_name(), ::getpid(), utc_now());
}

std::string read_holder(int fd) {
  char buf[512];
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::string line(buf, n > 0 ? static_cast<size_t>(n) : 0);
  return line.substr(0, line.find('\n'));
}

std::string field(const std::string& line, const std::string& key) {
  const size_t at = line.find(key + "=");
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size() + 1;
  return line.substr(begin, line.find(' ', begin) - begin);
}

}  // namespace

RunLock::RunLock(const std::string& run_dir, const std::string& job) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) throw IoError(fmt::format("cannot create run directory {}: {}", run_dir, ec.message()));
  const std::string path = run_dir + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError(fmt::format("cannot open the run lock {}: {}", path, std::strerror(errno)));
  // An empty identity is this process alone: a fresh random one no other process presents.
  std::random_device entropy;
  const std::string me = job.empty() ? fmt::format("solo-{:08x}{:08x}{:08x}", entropy(), entropy(), entropy()) : job;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {  // the first: name ourselves, then let the job in
      const std::string line = holder_line(me);
      if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size())) {
        throw IoError(fmt::format("cannot write the run lock {}: {}", path, std::strerror(errno)));
      }
      if (!job.empty()) ::flock(fd_, LOCK_SH);
      return;
    }
    const std::string holder = read_holder(fd_);
    // The same job shares it; the holder may be between its exclusive and shared lock: retry.
    if (!job.empty() && field(holder, "job") == job && ::flock(fd_, LOCK_SH | LOCK_NB) == 0) return;
    const bool named = !field(holder, "pid").empty();
    if ((named && field(holder, "job") != job) || std::chrono::steady_clock::now() > deadline) {
      ::close(fd_);
      fd_ = -1;
      throw ConfigError(fmt::format(
          "run directory {} is in use by another run: {} ({}); wait for it to end, stop it, or use another --run-dir",
          run_dir,
          named ? fmt::format("pid {} on {} since {}", field(holder, "pid"), field(holder, "host"),
                              field(holder, "started"))
                : "a process starting up",
          path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace tessera
