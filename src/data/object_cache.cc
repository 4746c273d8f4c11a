#include "data/object_cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "data/dataset.h"
#include "storage/s3_client.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
constexpr int kConnections = 4;  // ranged GETs in flight per object

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// An exclusive flock on PATH.lock for the scope: one fetcher per cached file per node.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw IoError(fmt::format("cannot open {}.lock: {}", path, std::strerror(errno)));
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) throw IoError(fmt::format("cannot lock {}.lock: {}", path, std::strerror(errno)));
    }
  }
  ~FileLock() { ::close(fd_); }  // releases the lock
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

std::string cache_path(const std::string& cache_dir, const storage::ObjectUrl& url) {
  return (fs::path(cache_dir) / "s3" / url.bucket / url.key).string();
}

FetchStats fetch_to_cache(storage::S3Client& s3, const storage::ObjectUrl& url, uint64_t bytes,
                          const std::string& path) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) throw IoError(fmt::format("cannot create the cache directory of {}: {}", path, ec.message()));
  FileLock lock(path);
  if (fs::exists(path, ec) && fs::file_size(path, ec) == bytes) return {};
  const double t0 = now_s();
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(fmt::format("cannot create {}: {}", tmp, std::strerror(errno)));
  const uint64_t range = std::max<uint64_t>(s3.options().part_bytes, 1);
  const auto ranges = static_cast<int64_t>((bytes + range - 1) / range);
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto worker = [&] {
    std::vector<char> buffer;
    for (int64_t i = next++; i < ranges; i = next++) {
      try {
        const uint64_t begin = static_cast<uint64_t>(i) * range, n = std::min(range, bytes - begin);
        buffer.resize(n);
        s3.get_range(url, begin, n, buffer.data());
        for (uint64_t done = 0; done < n;) {
          const ssize_t w = ::pwrite(fd, buffer.data() + done, n - done, static_cast<off_t>(begin + done));
          if (w < 0 && errno == EINTR) continue;
          if (w <= 0) throw IoError(fmt::format("cannot write {}: {}", tmp, std::strerror(errno)));
          done += static_cast<uint64_t>(w);
        }
      } catch (...) {
        std::lock_guard<std::mutex> guard(error_mu);
        if (!error) error = std::current_exception();
        next = ranges;  // the others stop after their current range
      }
    }
  };
  std::vector<std::thread> threads;
  for (int64_t k = 0; k < std::min<int64_t>(kConnections, ranges); ++k) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  const bool closed = ::close(fd) == 0;
  if (!error && !closed) error = std::make_exception_ptr(IoError(fmt::format("cannot close {}", tmp)));
  if (!error && ::rename(tmp.c_str(), path.c_str()) != 0) {
    error =
        std::make_exception_ptr(IoError(fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(errno))));
  }
  if (error) {
    ::unlink(tmp.c_str());
    std::rethrow_exception(error);
  }
  FetchStats stats{ranges, bytes, now_s() - t0};
  log::info("data: fetched {} into {}: {:.1f} MB in {} ranged GET(s), {:.0f} MB/s", url.str(), path, bytes / 1e6,
            ranges, bytes / 1e6 / std::max(stats.seconds, 1e-6));
  return stats;
}

int64_t upload_dataset(storage::S3Client& s3, const std::string& dir, const storage::ObjectUrl& url) {
  const int64_t before = s3.counts().puts();
  const DatasetManifest m = read_manifest(dir);
  std::vector<std::string> files = {m.tokenizer_file};
  for (const SplitManifest* split : {&m.train, &m.val}) {
    for (const ShardEntry& e : split->shards) files.push_back(e.file);
  }
  for (const std::string& name : files) {
    const std::string path = dir + "/" + name;
    std::error_code ec;
    const uint64_t bytes = fs::file_size(path, ec);
    if (ec) throw IoError(fmt::format("cannot read {}: {}", path, ec.message()));
    s3.upload(url.child(name), {{path, 0, bytes}});
  }
  const std::string manifest = dir + "/manifest.json";
  s3.upload(url.child("manifest.json"), {{manifest, 0, fs::file_size(manifest)}});
  return s3.counts().puts() - before;
}

}  // namespace tessera::data
