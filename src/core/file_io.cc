// Writing files so that a crash never leaves a damaged one.
#include "core/file_io.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace tessera {

std::string FileBytes::reason() const { return std::strerror(error); }

int read_to_end(int fd, std::string& out, size_t max_bytes) {
  // The size is a hint (one byte more, to see the end in the first pass): a file that grows or
  // shrinks while read, or reports no size, is read to its end. A size over max_bytes is refused
  // unread; else never more than one byte past max_bytes is read: that byte is how a file over the
  // limit shows when its size did not say so.
  struct stat st {};
  const size_t hint = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? static_cast<size_t>(st.st_size) : 0;
  if (hint > max_bytes) return EFBIG;
  const size_t start = out.size();
  const size_t cap = max_bytes >= SIZE_MAX - start - 1 ? SIZE_MAX : start + max_bytes + 1;  // no overflow
  size_t n = start;
  out.resize(std::min(cap, n + std::max<size_t>(hint + 1, 4096)));
  int error = 0;
  for (;;) {
    if (n == out.size()) {
      if (n == cap) break;
      out.resize(std::min(cap, 2 * n));
    }
    const ssize_t r = ::read(fd, out.data() + n, out.size() - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) error = errno;
    if (r <= 0) break;
    n += static_cast<size_t>(r);
  }
  out.resize(n);
  if (error == 0 && n - start > max_bytes) error = EFBIG;
  return error;
}

FileBytes try_read_file(const std::string& path, size_t max_bytes) {
  FileBytes out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    out.error = errno;
    return out;
  }
  out.error = read_to_end(fd, out.bytes, max_bytes);
  ::close(fd);
  return out;
}

std::string read_file(const std::string& path) {
  FileBytes f = try_read_file(path);
  if (!f) throw IoError(fmt::format("cannot read {}: {}", path, f.reason()));
  return std::move(f.bytes);
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw IoError(fmt::format("cannot write {}: {}", path, std::strerror(errno)));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

namespace {

// Opens `path` read-only and fsyncs it; the open descriptor, or IoError naming the file.
int open_synced(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw IoError(fmt::format("cannot fsync {}: {}", path, std::strerror(err)));
  }
  return fd;
}

}  // namespace

void fsync_path(const std::string& path) { ::close(open_synced(path)); }

void fsync_and_drop_cache(const std::string& path) {
  const int fd = open_synced(path);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // clean pages only, hence after the fsync
  ::close(fd);
}

void sync_parent_dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  // EINVAL: a file system that cannot fsync a directory (some FUSE mounts) has nothing to flush.
  if (dfd < 0 || (::fsync(dfd) != 0 && errno != EINVAL)) {
    const int err = errno;
    if (dfd >= 0) ::close(dfd);
    throw IoError(fmt::format("cannot fsync the directory {}: {}", dir, std::strerror(err)));
  }
  ::close(dfd);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  // A leftover temporary (a crash) or a planted symlink goes first; O_EXCL | O_NOFOLLOW then
  // never writes through a link another user placed there in the meantime.
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(fmt::format("cannot create {}: {}", tmp, std::strerror(errno)));
  try {
    write_all(fd, bytes.data(), bytes.size(), tmp);
    if (::fsync(fd) != 0) throw IoError(fmt::format("cannot fsync {}: {}", tmp, std::strerror(errno)));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw IoError(fmt::format("cannot close {}: {}", tmp, std::strerror(err)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw IoError(fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(err)));
  }
  sync_parent_dir(path);  // the rename is durable only once the directory entry is
}

}  // namespace tessera
