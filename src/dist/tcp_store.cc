// A store served over TCP by one process of the job (torchrun-style MASTER_ADDR:MASTER_PORT).
//
// Frames, both ways little-endian: a request is u8 op, u32 key length, key, u32 value length,
// value; a reply is u8 status, u32 length, data. The server keeps ROUND/KEY -> value in memory;
// clients poll for keys they wait on (2 ms growing to 50 ms), as the etcd store does.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/process_group.h"
#include "dist/store.h"
#include "dist/store_impl.h"

namespace tessera::dist {
namespace {

enum Op : uint8_t { kHello = 1, kSet, kGet, kAdd, kCheck, kList };
enum Status : uint8_t { kOk = 0, kMissing, kRefused, kNotInteger };

bool read_exact(int fd, void* out, size_t n) {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool write_exact(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_blob(int fd, std::string* out) {
  uint32_t n = 0;
  if (!read_exact(fd, &n, 4) || n > (64u << 20)) return false;
  out->resize(n);
  return read_exact(fd, out->data(), n);
}

bool write_frame(int fd, uint8_t head, const std::string& a, const std::string* b) {
  std::string frame(1, static_cast<char>(head));
  const auto append = [&](const std::string& s) {
    const uint32_t n = static_cast<uint32_t>(s.size());
    frame.append(reinterpret_cast<const char*>(&n), 4);
    frame += s;
  };
  append(a);
  if (b != nullptr) append(*b);
  return write_exact(fd, frame.data(), frame.size());
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    out.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

// "HOST:PORT" -> a resolved IPv4 address.
sockaddr_in resolve(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos) throw StoreError("tcp store " + endpoint + ": expected HOST:PORT");
  const std::string host = endpoint.substr(0, colon), port = endpoint.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    throw StoreError("tcp store " + endpoint + ": cannot resolve the host");
  }
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  return addr;
}

}  // namespace

struct TcpStoreServer::Impl {
  int listen_fd = -1;
  int port = 0;
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::string token;  // claimed by the first client
  std::map<std::string, std::string> data;
  std::vector<int> clients;
  std::vector<std::thread> threads;
  std::thread acceptor;

  void serve(int fd) {
    bool greeted = false;
    for (;;) {
      uint8_t op = 0;
      std::string key, value;
      if (!read_exact(fd, &op, 1) || !read_blob(fd, &key) || !read_blob(fd, &value)) return;
      uint8_t status = kOk;
      std::string reply;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (op == kHello) {
          if (token.empty()) token = key;
          greeted = token == key;
          status = greeted ? kOk : kRefused;
          reply = token;
        } else if (!greeted) {
          status = kRefused;
          reply = token;
        } else if (op == kSet) {
          data[key] = value;
        } else if (op == kGet) {
          auto it = data.find(key);
          if (it == data.end()) status = kMissing;
          else reply = it->second;
        } else if (op == kAdd) {  // an absent key counts as 0; a present one must hold an integer
          auto it = data.find(key);
          int64_t now = 0;
          if (it != data.end() && !detail::parse_counter(it->second, &now)) {
            status = kNotInteger;
          } else {
            reply = data[key] = std::to_string(now + std::strtoll(value.c_str(), nullptr, 10));
          }
        } else if (op == kCheck) {
          for (const std::string& k : split_lines(key)) {
            if (data.count(k) == 0) status = kMissing;
          }
        } else if (op == kList) {
          for (auto it = data.lower_bound(key); it != data.end() && it->first.rfind(key, 0) == 0; ++it) {
            reply += it->first + "\n";
          }
        }
      }
      if (!write_frame(fd, status, reply, nullptr)) return;
    }
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port) : impl_(std::make_unique<Impl>()) {
  const std::string endpoint = host + ":" + std::to_string(port);
  sockaddr_in addr = resolve(endpoint);
  impl_->listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(impl_->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (impl_->listen_fd < 0 || ::bind(impl_->listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(impl_->listen_fd, 256) != 0) {
    const int err = errno;
    if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
    throw StoreError("tcp store: cannot listen on " + endpoint + ": " + std::strerror(err));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  impl_->port = ntohs(addr.sin_port);
  Impl* s = impl_.get();
  impl_->acceptor = std::thread([s] {
    while (!s->stop) {
      pollfd p{s->listen_fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int fd = ::accept4(s->listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      const int on = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
      std::lock_guard<std::mutex> lock(s->mu);
      s->clients.push_back(fd);
      s->threads.emplace_back([s, fd] { s->serve(fd); });
    }
  });
}

TcpStoreServer::~TcpStoreServer() {
  impl_->stop = true;
  impl_->acceptor.join();
  ::close(impl_->listen_fd);
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (const int fd : impl_->clients) ::shutdown(fd, SHUT_RDWR);  // their threads see EOF
    threads.swap(impl_->threads);
  }
  for (auto& t : threads) t.join();
  for (const int fd : impl_->clients) ::close(fd);
}

int TcpStoreServer::port() const { return impl_->port; }

namespace {

class TcpStore final : public Store {
 public:
  TcpStore(std::string endpoint, const std::string& token, std::string round, Millis timeout)
      : endpoint_(std::move(endpoint)), round_(std::move(round)) {
    if (!detail::valid_store_name(token) || !detail::valid_store_name(round_)) {
      throw StoreError("tcp store " + endpoint_ + ": invalid job token or round (use [A-Za-z0-9_.-])");
    }
    const sockaddr_in addr = resolve(endpoint_);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (auto pause = Millis(2);; pause = std::min(pause * 2, Millis(100))) {  // the server may start later
      fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) break;
      const int err = errno;
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
      if (std::chrono::steady_clock::now() + pause > deadline) {
        throw StoreError("tcp store " + endpoint_ + ": cannot connect within " + std::to_string(timeout.count()) +
                         " ms: " + std::strerror(err));
      }
      std::this_thread::sleep_for(pause);
    }
    const int on = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    std::string theirs;
    if (request(kHello, token, "", &theirs, "(hello)") == kRefused) {
      throw StoreError("tcp store " + endpoint_ + " belongs to job token '" + theirs + "', not '" + token + "'");
    }
  }
  ~TcpStore() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void set(const std::string& key, const Bytes& value) override {
    request(kSet, full(key), std::string(value.begin(), value.end()), nullptr, key);
  }
  Bytes get(const std::string& key, Millis timeout) override {
    std::string value;
    poll(timeout, [&] { return request(kGet, full(key), "", &value, key) == kOk; },
         [&] { return "key '" + key + "'"; });
    return Bytes(value.begin(), value.end());
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::string value;
    if (request(kAdd, full(key), std::to_string(delta), &value, key) == kNotInteger) {
      throw StoreError("tcp store " + endpoint_ + ": add() on key '" + key + "' whose value is not an integer");
    }
    return std::stoll(value);
  }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    poll(timeout, [&] { return check(keys); }, [&] {
      std::vector<std::string> missing;
      for (const auto& k : keys) {
        if (!check({k})) missing.push_back(k);
      }
      return "key(s) " + detail::join_keys(missing);
    });
  }
  bool check(const std::vector<std::string>& keys) override {
    if (keys.empty()) return true;
    std::string joined;
    for (const auto& k : keys) {
      if (!joined.empty()) joined += '\n';
      joined += full(k);
    }
    return request(kCheck, joined, "", nullptr, "(check)") == kOk;
  }
  std::vector<std::string> list(const std::string& prefix) override {
    std::string text;
    request(kList, full(prefix), "", &text, prefix);
    std::vector<std::string> keys;
    for (const std::string& k : split_lines(text)) keys.push_back(k.substr(round_.size() + 1));
    std::sort(keys.begin(), keys.end());
    return keys;
  }

 private:
  std::string full(const std::string& key) const { return round_ + "/" + key; }

  uint8_t request(uint8_t op, const std::string& key, const std::string& value, std::string* reply,
                  const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    uint8_t status = 0;
    std::string data;
    if (!write_frame(fd_, op, key, &value) || !read_exact(fd_, &status, 1) || !read_blob(fd_, &data)) {
      throw StoreError("tcp store " + endpoint_ + ": connection lost during the request for " + what);
    }
    if (reply != nullptr) *reply = std::move(data);
    return status;
  }

  template <typename Done, typename Describe>
  void poll(Millis timeout, Done&& done, Describe&& describe) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (auto pause = Millis(2);; pause = std::min(pause * 2, Millis(50))) {
      if (done()) return;
      if (std::chrono::steady_clock::now() >= deadline) {
        throw StoreError("tcp store " + endpoint_ + " (round " + round_ + "): timed out after " +
                         std::to_string(timeout.count()) + " ms waiting for " + describe());
      }
      std::this_thread::sleep_for(std::min(pause, std::chrono::duration_cast<Millis>(
                                                      deadline - std::chrono::steady_clock::now() + Millis(1))));
    }
  }

  std::string endpoint_, round_;
  int fd_ = -1;
  std::mutex mu_;
};

}  // namespace

std::unique_ptr<Store> make_tcp_store(const std::string& endpoint, const std::string& job_token,
                                      const std::string& round, Millis timeout) {
  return std::make_unique<TcpStore>(endpoint, job_token, round, timeout);
}

}  // namespace tessera::dist
