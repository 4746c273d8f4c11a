// A store served over TCP by one process of the job (torchrun-style MASTER_ADDR:MASTER_PORT).
//
// Frames and the handshake: tcp_store_frame.h. The server keeps ROUND/KEY -> value in memory;
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
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "comm/job_auth.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "comm/store_impl.h"
#include "comm/tcp_store_frame.h"

namespace tessera::comm {
namespace {

using Clock = std::chrono::steady_clock;
using tcp::Parse;
using tcp::Request;

// The server's bounds (RELIABILITY.md row 23): a stranger costs at most one of kMaxPending
// connections (the oldest is closed for a new one) for at most kHelloTimeout, and at most
// kMaxHelloBlob bytes per field; an authenticated client whose frame or reply stalls for
// kStallTimeout is dropped. The job's own processes hold a few connections each.
constexpr size_t kMaxPending = 64;
constexpr size_t kMaxClients = 1024;
constexpr Millis kHelloTimeout{5000};
constexpr Millis kStallTimeout{60000};
constexpr size_t kReadChunk = 64 << 10;

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

// One thread serves every connection from a poll(2) loop over non-blocking sockets, so the
// number of threads does not grow with the number of clients (or strangers).
struct TcpStoreServer::Impl {
  struct Conn {
    int fd = -1;
    bool authed = false;
    bool closing = false;  // close once `out` is sent (after a refusal)
    std::string nonce;     // the challenge this connection was sent
    std::string in, out;
    Clock::time_point opened, progress;
  };

  std::string token;
  int listen_fd = -1;
  int wake[2] = {-1, -1};  // a byte here ends the loop at once
  int port = 0;
  std::atomic<bool> stop{false};
  std::map<std::string, std::string> data;
  std::vector<Conn> conns;
  Clock::time_point accept_again;  // accepting paused until then (out of fds)
  std::thread loop;

  void run() {
    std::vector<pollfd> fds;
    while (!stop) {
      // Out of fds, the listening socket stays readable: leave it alone for a while, not spin.
      const short accepting = Clock::now() >= accept_again ? POLLIN : 0;
      fds.assign({{wake[0], POLLIN, 0}, {listen_fd, accepting, 0}});
      for (const Conn& c : conns) {
        const short want = static_cast<short>((c.closing ? 0 : POLLIN) | (c.out.empty() ? 0 : POLLOUT));
        fds.push_back({c.fd, want, 0});
      }
      if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) break;
      const auto now = Clock::now();
      for (size_t i = 0; i < conns.size(); ++i) {
        Conn& c = conns[i];
        bool keep = true;
        if (fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) keep = receive(c, now);
        if (keep && !c.out.empty()) keep = flush(c, now);
        if (keep && c.closing && c.out.empty()) keep = false;
        if (keep && expired(c, now)) keep = false;
        if (!keep) close_conn(c);
      }
      if (fds[1].revents & POLLIN) accept_all(now);
      conns.erase(std::remove_if(conns.begin(), conns.end(), [](const Conn& c) { return c.fd < 0; }), conns.end());
    }
  }

  void accept_all(Clock::time_point now) {
    for (;;) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {  // EAGAIN; or out of fds (EMFILE, ENFILE): the kernel's backlog holds the rest
        if (errno == EMFILE || errno == ENFILE) accept_again = now + Millis(100);
        return;
      }
      const int on = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
      std::vector<Conn*> pending;
      for (Conn& c : conns) {
        if (c.fd >= 0 && !c.authed) pending.push_back(&c);
      }
      if (pending.size() >= kMaxPending) close_conn(*pending.front());  // the oldest: accepted first
      Conn c;
      c.fd = fd;
      c.nonce = auth::random_bytes(auth::kProofBytes);
      c.opened = c.progress = now;
      c.out = tcp::encode_frame(tcp::kOk, c.nonce);
      conns.push_back(std::move(c));
      flush(conns.back(), now);
    }
  }

  // Reads what arrived and answers every whole request; false: close (EOF, error, bad frame).
  bool receive(Conn& c, Clock::time_point now) {
    char buf[kReadChunk];
    const size_t room = c.authed ? sizeof(buf) : 4096;
    const ssize_t n = ::recv(c.fd, buf, room, 0);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    if (n == 0) return false;
    c.in.append(buf, static_cast<size_t>(n));
    c.progress = now;
    while (!c.closing) {
      Request r;
      size_t used = 0;
      const Parse p = tcp::parse_request(c.in, c.authed ? tcp::kMaxBlob : tcp::kMaxHelloBlob, &r, &used);
      if (p == Parse::kBad) return false;
      if (p == Parse::kNeedMore) break;
      c.in.erase(0, used);
      answer(c, r);
    }
    return true;
  }

  void answer(Conn& c, const Request& r) {
    if (!c.authed) {
      const bool proven = r.op == tcp::kHello && r.key.size() == auth::kProofBytes &&
                          auth::same_secret(r.value, auth::proof(token, "client", c.nonce, r.key));
      const auto authed = std::count_if(conns.begin(), conns.end(), [](const Conn& o) { return o.authed; });
      if (!proven || authed >= static_cast<long>(kMaxClients)) {
        c.out += tcp::encode_frame(tcp::kRefused, proven ? "too many clients" : "wrong job token");
        c.closing = true;
        return;
      }
      c.authed = true;
      c.out += tcp::encode_frame(tcp::kOk, auth::proof(token, "server", c.nonce, r.key));
      return;
    }
    uint8_t status = tcp::kOk;
    std::string reply;
    if (r.op == tcp::kSet) {
      data[r.key] = r.value;
    } else if (r.op == tcp::kGet) {
      auto it = data.find(r.key);
      if (it == data.end())
        status = tcp::kMissing;
      else
        reply = it->second;
    } else if (r.op == tcp::kAdd) {  // an absent key counts as 0; a present one must hold an integer
      auto it = data.find(r.key);
      int64_t now = 0, delta = 0;
      if ((it != data.end() && !detail::parse_counter(it->second, &now)) || !detail::parse_counter(r.value, &delta)) {
        status = tcp::kNotInteger;
      } else {
        reply = data[r.key] = std::to_string(now + delta);
      }
    } else if (r.op == tcp::kCheck) {
      for (const std::string& k : split_lines(r.key)) {
        if (data.count(k) == 0) status = tcp::kMissing;
      }
    } else if (r.op == tcp::kList) {
      for (auto it = data.lower_bound(r.key); it != data.end() && it->first.rfind(r.key, 0) == 0; ++it) {
        reply += it->first + "\n";
      }
    } else {  // a second hello
      status = tcp::kRefused;
    }
    c.out += tcp::encode_frame(status, reply);
  }

  // Sends what the socket takes now; false: the peer is gone.
  bool flush(Conn& c, Clock::time_point now) {
    while (!c.out.empty()) {
      const ssize_t w = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (w < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      c.out.erase(0, static_cast<size_t>(w));
      c.progress = now;
    }
    return true;
  }

  static bool expired(const Conn& c, Clock::time_point now) {
    if (!c.authed) return now - c.opened > kHelloTimeout;
    return (!c.in.empty() || !c.out.empty()) && now - c.progress > kStallTimeout;
  }

  static void close_conn(Conn& c) {
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
    c.authed = false;  // no longer counts as pending or as a client
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port, const std::string& job_token)
    : impl_(std::make_unique<Impl>()) {
  const std::string endpoint = host + ":" + std::to_string(port);
  if (!detail::valid_store_name(job_token)) {
    throw StoreError("tcp store " + endpoint + ": invalid job token (use [A-Za-z0-9_.-])");
  }
  impl_->token = job_token;
  sockaddr_in addr = resolve(endpoint);
  impl_->listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const int one = 1;
  ::setsockopt(impl_->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (impl_->listen_fd < 0 || ::bind(impl_->listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(impl_->listen_fd, 256) != 0 || ::pipe2(impl_->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    const int err = errno;
    if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
    throw StoreError("tcp store: cannot listen on " + endpoint + ": " + std::strerror(err));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  impl_->port = ntohs(addr.sin_port);
  impl_->loop = std::thread([s = impl_.get()] { s->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  impl_->stop = true;
  const char byte = 0;
  (void)!::write(impl_->wake[1], &byte, 1);
  impl_->loop.join();
  for (Impl::Conn& c : impl_->conns) Impl::close_conn(c);
  ::close(impl_->listen_fd);
  ::close(impl_->wake[0]);
  ::close(impl_->wake[1]);
}

int TcpStoreServer::port() const { return impl_->port; }

namespace {

enum class Io { kOk, kClosed, kTimedOut };

// Waits until fd is ready for `events` or the deadline passes.
Io await(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
    if (left <= 0) return Io::kTimedOut;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (r > 0) return Io::kOk;
    if (r < 0 && errno != EINTR) return Io::kClosed;
  }
}

Io send_all(int fd, std::string_view data, Clock::time_point deadline) {
  while (!data.empty()) {
    const ssize_t w = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (w > 0) {
      data.remove_prefix(static_cast<size_t>(w));
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (const Io io = await(fd, POLLOUT, deadline); io != Io::kOk) return io;
    } else {
      return Io::kClosed;
    }
  }
  return Io::kOk;
}

Io recv_exact(int fd, char* out, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, out, n, 0);
    if (r > 0) {
      out += r;
      n -= static_cast<size_t>(r);
    } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (const Io io = await(fd, POLLIN, deadline); io != Io::kOk) return io;
    } else {
      return Io::kClosed;
    }
  }
  return Io::kOk;
}

// A reply frame: status and data (at most max_bytes, else kClosed: not our server).
Io recv_reply(int fd, uint8_t* status, std::string* data, Clock::time_point deadline, size_t max_bytes) {
  char head[5];
  if (const Io io = recv_exact(fd, head, 5, deadline); io != Io::kOk) return io;
  uint32_t n = 0;
  std::memcpy(&n, head + 1, 4);
  if (n > max_bytes) return Io::kClosed;
  *status = static_cast<uint8_t>(head[0]);
  data->resize(n);
  return recv_exact(fd, data->data(), n, deadline);
}

// A reason a server gave, printable and short, for an error message.
std::string printable(const std::string& text) {
  std::string out;
  for (char c : text.substr(0, 64)) out += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  return out;
}

class TcpStore final : public Store {
 public:
  TcpStore(std::string endpoint, const std::string& token, std::string round, Millis timeout)
      : endpoint_(std::move(endpoint)), round_(std::move(round)), timeout_(timeout) {
    if (!detail::valid_store_name(token) || !detail::valid_store_name(round_)) {
      throw StoreError("tcp store " + endpoint_ + ": invalid job token or round (use [A-Za-z0-9_.-])");
    }
    const sockaddr_in addr = resolve(endpoint_);
    const auto deadline = Clock::now() + timeout;
    // The server may start later, or close a connection it had no room for: retry until then.
    for (auto pause = Millis(2);; pause = std::min(pause * 2, Millis(100))) {
      std::string why;
      if (open(addr, token, deadline, &why)) break;
      if (Clock::now() + pause > deadline) {
        throw StoreError("tcp store " + endpoint_ + ": cannot connect within " + std::to_string(timeout.count()) +
                         " ms: " + why);
      }
      std::this_thread::sleep_for(pause);
    }
  }
  ~TcpStore() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void set(const std::string& key, const Bytes& value) override {
    request(tcp::kSet, full(key), std::string(value.begin(), value.end()), nullptr, key);
  }
  Bytes get(const std::string& key, Millis timeout) override {
    std::string value;
    poll(
        timeout, [&] { return request(tcp::kGet, full(key), "", &value, key) == tcp::kOk; },
        [&] { return "key '" + key + "'"; });
    return Bytes(value.begin(), value.end());
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::string value;
    int64_t now = 0;
    if (request(tcp::kAdd, full(key), std::to_string(delta), &value, key) == tcp::kNotInteger ||
        !detail::parse_counter(value, &now)) {
      throw StoreError("tcp store " + endpoint_ + ": add() on key '" + key + "' whose value is not an integer");
    }
    return now;
  }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    poll(
        timeout, [&] { return check(keys); },
        [&] {
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
    return request(tcp::kCheck, joined, "", nullptr, "(check)") == tcp::kOk;
  }
  std::vector<std::string> list(const std::string& prefix) override {
    std::string text;
    request(tcp::kList, full(prefix), "", &text, prefix);
    std::vector<std::string> keys;
    for (const std::string& k : split_lines(text)) keys.push_back(k.substr(round_.size() + 1));
    std::sort(keys.begin(), keys.end());
    return keys;
  }

 private:
  std::string full(const std::string& key) const { return round_ + "/" + key; }

  // Connects and proves the token both ways (tcp_store_frame.h). False with `why` for what a
  // retry may cure (nothing listening yet, a dropped connection); throws when refused.
  bool open(const sockaddr_in& addr, const std::string& token, Clock::time_point deadline, std::string* why) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd_ < 0) {
      *why = std::strerror(errno);
      return false;
    }
    const bool connected = ::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0 ||
                           (errno == EINPROGRESS && await(fd_, POLLOUT, deadline) == Io::kOk);
    int err = connected ? 0 : errno;
    socklen_t len = sizeof(err);
    if (connected) ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
    uint8_t status = 0;
    std::string server_nonce, reply;
    Io io = err == 0 ? recv_reply(fd_, &status, &server_nonce, deadline, tcp::kMaxHelloBlob) : Io::kClosed;
    const std::string client_nonce = auth::random_bytes(auth::kProofBytes);
    if (io == Io::kOk && (status != tcp::kOk || server_nonce.size() != auth::kProofBytes)) io = Io::kClosed;
    if (io == Io::kOk) {
      const std::string mine = auth::proof(token, "client", server_nonce, client_nonce);
      const std::string_view value = mine;
      io = send_all(fd_, tcp::encode_frame(tcp::kHello, client_nonce, &value), deadline);
    }
    if (io == Io::kOk) io = recv_reply(fd_, &status, &reply, deadline, tcp::kMaxHelloBlob);
    if (io != Io::kOk) {
      *why = err != 0              ? std::strerror(err)
             : io == Io::kTimedOut ? "no answer to the handshake"
                                   : "the connection closed during the handshake";
      ::close(fd_);
      fd_ = -1;
      return false;
    }
    const bool proven =
        status == tcp::kOk && auth::same_secret(reply, auth::proof(token, "server", server_nonce, client_nonce));
    if (!proven) {
      ::close(fd_);
      fd_ = -1;
      if (status == tcp::kRefused) {
        throw StoreError("tcp store " + endpoint_ + " refused this process: " + printable(reply) +
                         " (TESSERA_JOB_TOKEN must be the same for every process of the job)");
      }
      throw StoreError("tcp store " + endpoint_ +
                       ": the server could not prove it holds the job token; it is not this job's store");
    }
    return true;
  }

  // One request and its reply within timeout_; on any failure the connection is dropped (its
  // state is unknown) and this and every later request throw.
  uint8_t request(uint8_t op, const std::string& key, const std::string& value, std::string* reply,
                  const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ < 0)
      throw StoreError("tcp store " + endpoint_ + ": the connection was lost before the request for " + what);
    const auto deadline = Clock::now() + timeout_;
    const std::string_view v = value;
    uint8_t status = 0;
    std::string data;
    Io io = send_all(fd_, tcp::encode_frame(op, key, &v), deadline);
    if (io == Io::kOk) io = recv_reply(fd_, &status, &data, deadline, tcp::kMaxBlob);
    if (io != Io::kOk) {
      ::close(fd_);
      fd_ = -1;
      throw StoreError("tcp store " + endpoint_ +
                       (io == Io::kTimedOut ? ": no reply within " + std::to_string(timeout_.count()) + " ms"
                                            : ": connection lost") +
                       " during the request for " + what);
    }
    if (reply != nullptr) *reply = std::move(data);
    return status;
  }

  template <typename Done, typename Describe>
  void poll(Millis timeout, Done&& done, Describe&& describe) {
    const auto deadline = Clock::now() + timeout;
    for (auto pause = Millis(2);; pause = std::min(pause * 2, Millis(50))) {
      if (done()) return;
      if (Clock::now() >= deadline) {
        throw StoreError("tcp store " + endpoint_ + " (round " + round_ + "): timed out after " +
                         std::to_string(timeout.count()) + " ms waiting for " + describe());
      }
      std::this_thread::sleep_for(
          std::min(pause, std::chrono::duration_cast<Millis>(deadline - Clock::now() + Millis(1))));
    }
  }

  std::string endpoint_, round_;
  Millis timeout_;
  int fd_ = -1;
  std::mutex mu_;
};

}  // namespace

std::unique_ptr<Store> make_tcp_store(const std::string& endpoint, const std::string& job_token,
                                      const std::string& round, Millis timeout) {
  return std::make_unique<TcpStore>(endpoint, job_token, round, timeout);
}

}  // namespace tessera::comm
