// The TCP store against strangers and failures (RELIABILITY.md row 23, issue 12 items 1, 2, 8):
// a stranger learns nothing and costs bounded memory, fds and threads; a stopped server makes
// requests time out instead of hanging.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/job_auth.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "comm/tcp_store_frame.h"
#include "comm/test_util.h"
#include "core/file_io.h"

namespace tessera::comm {
namespace {

using namespace test_util;  // NOLINT: the shared test helpers

const std::string kToken = "the-Job_Token.value-42";

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A blocking socket to 127.0.0.1:port whose reads give up after `timeout_ms`; -1 if refused.
int raw_connect(int port, int timeout_ms = 2000) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Everything the peer sends until it closes or goes quiet for the socket's read timeout.
std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

// True once the peer has closed the connection (recv returns 0, or the reset).
bool closed_by_peer(int fd) {
  char buf[256];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    if (n < 0) return false;  // timed out: still open
  }
}

long status_field(const std::string& name) {  // from /proc/self/status, e.g. VmRSS (kB), Threads
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + ":", 0) == 0) return std::stol(line.substr(name.size() + 1));
  }
  return -1;
}

long open_fds() {
  long n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

void send_bytes(int fd, const std::string& bytes) { (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL); }

// A hello frame with a proof that does not come from the token.
std::string forged_hello() {
  const std::string nonce(auth::kProofBytes, 'n'), proof(auth::kProofBytes, 'p');
  const std::string_view v = proof;
  return tcp::encode_frame(tcp::kHello, nonce, &v);
}

TEST(TcpStoreServer, StrangerLearnsNothing) {
  TcpStoreServer server("127.0.0.1", 0, kToken);
  auto job = make_tcp_store("127.0.0.1:" + std::to_string(server.port()), kToken, "r0", Millis(2000));
  job->set("checkpoint.5.rank0", Bytes{'o', 'k'});

  // A wrong proof: refused with a reason that is not the token, then closed.
  int fd = raw_connect(server.port());
  ASSERT_GE(fd, 0);
  send_bytes(fd, forged_hello());
  std::string seen = read_all(fd);
  ::close(fd);
  EXPECT_TRUE(contains(seen, "wrong job token")) << seen;
  // A request without a hello, and one hoping the first hello claims the server.
  for (const std::string& frame :
       {tcp::encode_frame(tcp::kGet, "r0/checkpoint.5.rank0", nullptr), tcp::encode_frame(tcp::kHello, kToken)}) {
    fd = raw_connect(server.port());
    send_bytes(fd, frame);
    const std::string got = read_all(fd);
    ::close(fd);
    EXPECT_FALSE(contains(got, "ok")) << "a stranger read a key";
    seen += got;
  }
  EXPECT_FALSE(contains(seen, kToken)) << "the server sent the token";
  // The forged keys never landed: the job's store is unchanged.
  EXPECT_EQ(job->list(""), std::vector<std::string>{"checkpoint.5.rank0"});

  try {
    make_tcp_store("127.0.0.1:" + std::to_string(server.port()), "not-the-token", "r0", Millis(2000));
    FAIL() << "a client with another token was accepted";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "wrong job token")) << e.what();
    EXPECT_FALSE(contains(e.what(), kToken)) << e.what();
    EXPECT_FALSE(contains(e.what(), "not-the-token")) << e.what();
  }
}

// A frame announcing 32 MiB before authentication is refused from its header: nothing allocated.
TEST(TcpStoreServer, OversizedFrameBeforeHelloClosedUnread) {
  TcpStoreServer server("127.0.0.1", 0, kToken);
  const long rss0 = status_field("VmRSS");
  std::vector<int> fds;
  for (int i = 0; i < 32; ++i) {
    const int fd = raw_connect(server.port());
    std::string frame(1, static_cast<char>(tcp::kSet));
    const uint32_t huge = 32u << 20;  // under the authenticated cap: refused by the hello cap
    frame.append(reinterpret_cast<const char*>(&huge), 4);
    frame += std::string(60000, 'x');  // and then some of it
    send_bytes(fd, frame);
    fds.push_back(fd);
  }
  const auto t0 = Clock::now();
  for (int fd : fds) {
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_LT(status_field("VmRSS") - rss0, 16 * 1024) << "kB grown";
}

// 1000 idle connections and 100 of random bytes at a live server: the job's clients keep
// working, new ones get in, one thread serves them all, fds and memory stay bounded, and the
// idle strangers are gone after the 5 s hello deadline.
TEST(TcpStoreServer, FloodOfStrangersLeavesTheJobWorking) {
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = std::max<rlim_t>(lim.rlim_cur, std::min<rlim_t>(lim.rlim_max, 4096));
  ::setrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < 2400) GTEST_SKIP() << "needs 2400 fds, the limit is " << lim.rlim_cur;

  TcpStoreServer server("127.0.0.1", 0, kToken);
  const std::string endpoint = "127.0.0.1:" + std::to_string(server.port());
  auto job = make_tcp_store(endpoint, kToken, "r0", Millis(5000));
  job->set("a", Bytes{1});
  const long threads0 = status_field("Threads"), rss0 = status_field("VmRSS"), fds0 = open_fds();

  std::vector<int> idle;
  for (int i = 0; i < 1000; ++i) {
    const int fd = raw_connect(server.port(), 100);
    if (fd >= 0) idle.push_back(fd);
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 100; ++i) {
    const int fd = raw_connect(server.port(), 100);
    std::string junk(1 + rng() % 3000, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    send_bytes(fd, junk);
    ::close(fd);
  }
  EXPECT_EQ(job->get("a", Millis(100)), Bytes{1});                   // the established client is unaffected
  auto late = make_tcp_store(endpoint, kToken, "r0", Millis(5000));  // a new one gets in
  late->set("b", Bytes{2});
  EXPECT_EQ(job->get("b", Millis(100)), Bytes{2});
  EXPECT_EQ(status_field("Threads"), threads0);
  // The server keeps at most 64 strangers: the other ~940 sockets here saw their end close.
  const long server_fds = open_fds() - fds0 - static_cast<long>(idle.size()) - 1;  // -1: `late`
  EXPECT_LE(server_fds, 64 + 2) << "fds the server holds for strangers";
  EXPECT_LT(status_field("VmRSS") - rss0, 32 * 1024) << "kB grown";

  std::this_thread::sleep_for(std::chrono::milliseconds(5600));  // past the hello deadline
  int closed = 0;
  for (int fd : idle) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) == 1 && closed_by_peer(fd)) ++closed;
    ::close(fd);
  }
  EXPECT_EQ(closed, static_cast<int>(idle.size()));
  EXPECT_EQ(job->get("b", Millis(100)), Bytes{2});
}

// A TcpStoreServer in a forked child (so the test can stop it or starve it of fds), serving
// until the object goes; `max_fds` > 0 limits the child's open files.
struct ServerProcess {
  pid_t pid = -1;
  int port = 0;
  explicit ServerProcess(rlim_t max_fds = 0) {
    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) std::abort();
    std::fflush(nullptr);
    pid = ::fork();
    if (pid < 0) std::abort();
    if (pid == 0) {
      ::alarm(20);
      if (max_fds > 0) {
        const rlimit few{max_fds, max_fds};
        ::setrlimit(RLIMIT_NOFILE, &few);
      }
      TcpStoreServer server("127.0.0.1", 0, kToken);
      const int p = server.port();
      (void)!::write(pipe_fds[1], &p, sizeof(p));
      for (;;) ::pause();
    }
    if (::read(pipe_fds[0], &port, sizeof(port)) != static_cast<ssize_t>(sizeof(port))) port = 0;
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
  }
  ~ServerProcess() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

// CPU seconds (user + system) process `pid` has used, from /proc/PID/stat.
double cpu_seconds(pid_t pid) {
  const std::string text = read_file("/proc/" + std::to_string(pid) + "/stat");
  std::istringstream fields(text.substr(text.rfind(')') + 2));  // after "pid (comm) "
  std::string f;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stol(f);
    if (i == 15) stime = std::stol(f);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// A server out of file descriptors (EMFILE) waits for them instead of spinning on accept.
TEST(TcpStoreServer, OutOfFdsDoesNotSpin) {
  const ServerProcess server(24);
  ASSERT_NE(server.port, 0);
  std::vector<int> fds;
  for (int i = 0; i < 60; ++i) fds.push_back(raw_connect(server.port, 100));  // the backlog holds the rest
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double cpu0 = cpu_seconds(server.pid);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double used = cpu_seconds(server.pid) - cpu0;
  for (int fd : fds) ::close(fd);
  EXPECT_LT(used, 0.3) << "CPU seconds in 1 s while out of fds";
}

// Issue 12 item 8: a server that stops mid-run makes requests fail within the store's timeout.
TEST(TcpStore, RequestTimesOutWhenTheServerStops) {
  const ServerProcess server;
  ASSERT_NE(server.port, 0);
  auto s = make_tcp_store("127.0.0.1:" + std::to_string(server.port), kToken, "r0", Millis(300));
  s->set("k", Bytes{1});
  ::kill(server.pid, SIGSTOP);
  int ws = 0;
  ASSERT_EQ(::waitpid(server.pid, &ws, WUNTRACED), server.pid);  // stopped for sure
  const auto t0 = Clock::now();
  try {
    s->set("k", Bytes{2});
    ADD_FAILURE() << "a request to a stopped server returned";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "no reply within 300 ms")) << e.what();
    EXPECT_TRUE(contains(e.what(), "during the request for k")) << e.what();
  }
  EXPECT_GE(seconds_since(t0), 0.29);
  EXPECT_LT(seconds_since(t0), 1.5);
  EXPECT_THROW(s->get("k", Millis(10)), StoreError);  // the connection is dropped, not reused
}

// A server that does not hold the token cannot pass for the job's store, and one that never
// greets makes the client give up at its timeout.
TEST(TcpStore, ServerMustProveTheToken) {
  const int listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listen_fd, 8), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string endpoint = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  std::atomic<bool> greet{true};
  std::thread impostor([&] {
    for (int i = 0; i < 2; ++i) {
      const int fd = ::accept(listen_fd, nullptr, nullptr);
      if (fd < 0) return;
      if (greet) {
        send_bytes(fd, tcp::encode_frame(tcp::kOk, std::string(auth::kProofBytes, 'c')));
        char hello[1 + 4 + 32 + 4 + 32];
        (void)!::recv(fd, hello, sizeof(hello), MSG_WAITALL);
        send_bytes(fd, tcp::encode_frame(tcp::kOk, std::string(auth::kProofBytes, 'z')));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
      ::close(fd);
    }
  });
  try {
    make_tcp_store(endpoint, kToken, "r0", Millis(2000));
    ADD_FAILURE() << "an impostor passed for the job's store";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "could not prove it holds the job token")) << e.what();
  }
  greet = false;
  const auto t0 = Clock::now();
  try {
    make_tcp_store(endpoint, kToken, "r0", Millis(300));
    ADD_FAILURE() << "a server that never greets was accepted";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "cannot connect within 300 ms")) << e.what();
  }
  EXPECT_LT(seconds_since(t0), 1.0);
  impostor.join();
  ::close(listen_fd);
}

}  // namespace
}  // namespace tessera::comm
