// Store over a directory: one file per key, atomic publish by rename, add() under flock(2).
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "comm/job_auth.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "comm/store_impl.h"

namespace tessera::comm {
namespace {

std::string sys_error(const std::string& what, const std::string& path) {
  return "file store: " + what + " " + path + ": " + std::strerror(errno);
}

void check_name(const std::string& kind, const std::string& name) {
  if (!detail::valid_store_name(name))
    throw StoreError("file store: invalid " + kind + " '" + name + "' (use [A-Za-z0-9_.-])");
}

void make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) throw StoreError(sys_error("cannot create", path));
}

// Keys may hold any byte ('/' in Gloo's prefixed keys): escape to a flat, unambiguous file
// name. The "k_" prefix keeps key files apart from ".tmp" and ".lock".
std::string key_file(const std::string& key) {
  static const char* kHex = "0123456789abcdef";
  std::string out = "k_";
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '_' || c == '-' || c == '.') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// The inverse of key_file, or false for a name that is not a key file.
bool file_key(const std::string& name, std::string* key) {
  if (name.rfind("k_", 0) != 0) return false;
  key->clear();
  for (size_t i = 2; i < name.size(); ++i) {
    if (name[i] != '%') {
      *key += name[i];
      continue;
    }
    if (i + 2 >= name.size() || !std::isxdigit(static_cast<unsigned char>(name[i + 1])) ||
        !std::isxdigit(static_cast<unsigned char>(name[i + 2])))
      return false;
    *key += static_cast<char>(std::stoi(name.substr(i + 1, 2), nullptr, 16));
    i += 2;
  }
  return true;
}

bool read_file(const std::string& path, Bytes* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return false;
    throw StoreError(sys_error("cannot open", path));
  }
  out->clear();
  uint8_t buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      errno = e;
      throw StoreError(sys_error("cannot read", path));
    }
    if (n == 0) break;
    out->insert(out->end(), buf, buf + n);
  }
  ::close(fd);
  return true;
}

// Writes value to a unique temporary name in dir; returns that path.
std::string write_temp(const std::string& dir, const Bytes& value) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp = dir + "/.tmp." + std::to_string(::getpid()) + "." +
                    std::to_string(counter.fetch_add(1, std::memory_order_relaxed));
  // O_EXCL | O_NOFOLLOW: a name planted in advance (a symlink to a victim file) fails the open.
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw StoreError(sys_error("cannot create", tmp));
  size_t done = 0;
  while (done < value.size()) {
    ssize_t n = ::write(fd, value.data() + done, value.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      errno = e;
      throw StoreError(sys_error("cannot write", tmp));
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) throw StoreError(sys_error("cannot close", tmp));
  return tmp;
}

class FileStore final : public Store {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}

  void set(const std::string& key, const Bytes& value) override {
    std::string tmp = write_temp(dir_, value);
    std::string path = dir_ + "/" + key_file(key);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      int e = errno;
      ::unlink(tmp.c_str());
      errno = e;
      throw StoreError(sys_error("cannot publish key '" + key + "' as", path));
    }
  }

  Bytes get(const std::string& key, Millis timeout) override {
    Bytes out;
    poll_until(timeout, [&] { return read_file(dir_ + "/" + key_file(key), &out); },
               [&] { return "key '" + key + "'"; });
    return out;
  }

  // The value is the decimal text of the integer, so get() of an added key reads it back.
  int64_t add(const std::string& key, int64_t delta) override {
    std::string lock_path = dir_ + "/.lock";
    int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) throw StoreError(sys_error("cannot open", lock_path));
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno != EINTR) {
        int e = errno;
        ::close(fd);
        errno = e;
        throw StoreError(sys_error("cannot lock", lock_path));
      }
    }
    int64_t value = 0;
    try {
      Bytes cur;
      if (read_file(dir_ + "/" + key_file(key), &cur)) {
        if (!detail::parse_counter(std::string(cur.begin(), cur.end()), &value))
          throw StoreError("file store: add() on key '" + key + "' whose value is not an integer");
      }
      value += delta;
      std::string text = std::to_string(value);
      set(key, Bytes(text.begin(), text.end()));
    } catch (...) {
      ::close(fd);  // releases the lock
      throw;
    }
    ::close(fd);
    return value;
  }

  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    std::vector<std::string> missing;
    poll_until(
        timeout,
        [&] {
          missing.clear();
          for (const auto& k : keys)
            if (!exists(k)) missing.push_back(k);
          return missing.empty();
        },
        [&] { return "key(s) " + detail::join_keys(missing); });
  }

  bool check(const std::vector<std::string>& keys) override {
    for (const auto& k : keys)
      if (!exists(k)) return false;
    return true;
  }

  std::vector<std::string> list(const std::string& prefix) override {
    DIR* d = ::opendir(dir_.c_str());
    if (d == nullptr) throw StoreError(sys_error("cannot list", dir_));
    std::vector<std::string> keys;
    std::string key;
    while (const dirent* e = ::readdir(d))
      if (file_key(e->d_name, &key) && key.rfind(prefix, 0) == 0) keys.push_back(key);
    ::closedir(d);
    std::sort(keys.begin(), keys.end());
    return keys;
  }

 private:
  bool exists(const std::string& key) const {
    struct stat st;
    return ::stat((dir_ + "/" + key_file(key)).c_str(), &st) == 0;
  }

  // Polls with a backoff from 1 ms to 10 ms: rendezvous latency stays low while a long wait
  // costs ~100 stat calls a second.
  template <typename Ready, typename Describe>
  void poll_until(Millis timeout, Ready ready, Describe describe) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto sleep = Millis(1);
    for (;;) {
      if (ready()) return;
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline)
        throw StoreError("file store " + dir_ + ": timed out after " + std::to_string(timeout.count()) +
                         " ms waiting for " + describe());
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(sleep, deadline - now));
      sleep = std::min(sleep * 2, Millis(10));
    }
  }

  std::string dir_;
};

}  // namespace

std::unique_ptr<Store> make_file_store(const std::string& dir, const std::string& job_token,
                                       const std::string& round) {
  if (!detail::valid_store_name(job_token)) throw StoreError("file store: invalid job token (use [A-Za-z0-9_.-])");
  check_name("round", round);
  make_dir(dir);
  // The first process publishes DIR/job (the job's namespace, never the token) with link(2),
  // which fails if it exists, so exactly one job wins and it is never seen half-written.
  const std::string job = auth::job_namespace(job_token);
  std::string claim_path = dir + "/job";
  Bytes mine(job.begin(), job.end());
  std::string tmp = write_temp(dir, mine);
  int rc = ::link(tmp.c_str(), claim_path.c_str());
  int link_errno = errno;
  ::unlink(tmp.c_str());
  if (rc != 0) {
    errno = link_errno;
    if (link_errno != EEXIST) throw StoreError(sys_error("cannot create", claim_path));
    Bytes theirs;
    if (!read_file(claim_path, &theirs)) throw StoreError(sys_error("cannot read", claim_path));
    if (theirs != mine) throw StoreError("file store: " + dir + " belongs to another job: wrong job token");
  }
  std::string job_dir = dir + "/" + job;
  make_dir(job_dir);
  std::string round_dir = job_dir + "/" + round;
  make_dir(round_dir);
  return std::make_unique<FileStore>(round_dir);
}

}  // namespace tessera::comm
