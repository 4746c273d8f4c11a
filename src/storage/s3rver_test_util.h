// A real S3-compatible server for tests: s3rver (installed by scripts/setup.sh into build/tools)
// on a free loopback port with a data directory of its own, started, killed and restarted by the
// test. It checks access keys (not V4 signatures) and serves multipart uploads, ranged GETs and
// ListObjectsV2.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "storage/s3_client.h"

namespace tessera::storage::test_util {

inline std::string s3rver_binary() { return std::string(TESSERA_SOURCE_DIR) + "/build/tools/node_modules/.bin/s3rver"; }

inline int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

class S3rver {
 public:
  static constexpr const char* kBucket = "tessera-test";
  static constexpr const char* kAccessKey = "S3RVER";  // s3rver's built-in account
  static constexpr const char* kSecretKey = "S3RVER";

  S3rver() : port_(free_tcp_port()) {
    char tmpl[] = "/tmp/tessera_s3rver_XXXXXX";
    char* p = ::mkdtemp(tmpl);
    if (p == nullptr) std::abort();
    dir_ = p;
  }
  ~S3rver() {
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  const std::string& dir() const { return dir_; }
  S3Options options() const {
    S3Options o;
    o.endpoint = endpoint();
    o.access_key = kAccessKey;
    o.secret_key = kSecretKey;
    o.backoff_ms = 20;
    return o;
  }

  // Starts the server and waits until it answers; "" or why not.
  std::string start() {
    if (::access(s3rver_binary().c_str(), X_OK) != 0) {
      return s3rver_binary() + " is missing: run scripts/setup.sh (it installs s3rver)";
    }
    std::vector<std::string> args = {s3rver_binary(),       "-d",       dir_ + "/data",       "-a",   "127.0.0.1", "-p",
                                     std::to_string(port_), "--silent", "--configure-bucket", kBucket};
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) return "fork failed";
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // follows the forking thread: start from the main thread
      ::setenv("NODE_OPTIONS", "--openssl-legacy-provider", 1);  // its continuation tokens use DES
      const int fd = ::open((dir_ + "/s3rver.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 300; ++i) {
      int ws = 0;
      if (::waitpid(pid_, &ws, WNOHANG) == pid_) {
        pid_ = -1;
        return "s3rver exited during start-up; see " + dir_ + "/s3rver.log";
      }
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port_));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      const bool up = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
      ::close(fd);
      if (up) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return "s3rver not listening after 15 s";
  }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int ws = 0;
    ::waitpid(pid_, &ws, 0);
    pid_ = -1;
  }

 private:
  int port_;
  std::string dir_;
  pid_t pid_ = -1;
};

}  // namespace tessera::storage::test_util
