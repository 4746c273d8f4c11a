// The Store contract, run against the file store and a real etcd; etcd leases, restarts, URLs.
#include "comm/store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/etcd_reply.h"
#include "comm/job_auth.h"
#include "comm/process_group.h"
#include "comm/test_util.h"
#include "core/error.h"
#include "core/json.h"

namespace tessera::comm {
namespace {

using namespace test_util;  // NOLINT: the shared test helpers

constexpr const char* kEtcdBinary = "/usr/bin/etcd";

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A free TCP port on 127.0.0.1 (bound to port 0, then released; the race with other processes
// is accepted).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    std::abort();
  ::close(fd);
  return ntohs(a.sin_port);
}

// One etcd member on loopback with random ports and a data directory in /dev/shm (its fsyncs are
// then free), started and stopped by the test; restartable on the same ports and data.
class EtcdServer {
 public:
  EtcdServer() : client_port_(free_port()), peer_port_(free_port()) {
    char tmpl[] = "/dev/shm/tessera_etcd_XXXXXX";
    char tmpl_tmp[] = "/tmp/tessera_etcd_XXXXXX";
    char* p = ::mkdtemp(tmpl);
    if (p == nullptr) p = ::mkdtemp(tmpl_tmp);
    if (p == nullptr) std::abort();
    dir_ = p;
    while (peer_port_ == client_port_) peer_port_ = free_port();
  }
  ~EtcdServer() {
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  std::string log() const {
    std::string text;
    if (FILE* f = std::fopen((dir_ + "/etcd.log").c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
      std::fclose(f);
    }
    return text.size() > 3000 ? text.substr(text.size() - 3000) : text;
  }

  // Starts etcd and waits until it serves a transaction; returns "" or why it did not.
  std::string start() {
    std::string client = "http://" + endpoint();
    std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::vector<std::string> args = {kEtcdBinary,
                                     "--name=default",
                                     "--data-dir=" + dir_ + "/data",
                                     "--listen-client-urls=" + client,
                                     "--advertise-client-urls=" + client,
                                     "--listen-peer-urls=" + peer,
                                     "--initial-advertise-peer-urls=" + peer,
                                     "--initial-cluster=default=" + peer,
                                     "--log-level=warn"};
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) return "fork failed";
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test binary
      int fd = ::open((dir_ + "/etcd.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(kEtcdBinary, argv.data());
      ::_exit(127);
    }
    auto t0 = Clock::now();
    while (seconds_since(t0) < 15) {
      int ws = 0;
      if (::waitpid(pid_, &ws, WNOHANG) == pid_) {
        pid_ = -1;
        return "etcd exited during start-up; its log:\n" + log();
      }
      try {
        make_etcd_store(endpoint(), "probe", "probe", "r", Millis(250));
        startup_s_ = seconds_since(t0);
        return "";
      } catch (const StoreError&) {
      }
    }
    return "etcd not serving after 15 s; its log:\n" + log();
  }

  // SIGTERM, then SIGKILL after 5 s; kill_now: SIGKILL at once (a crash).
  void stop(bool kill_now = false) {
    if (pid_ <= 0) return;
    ::kill(pid_, kill_now ? SIGKILL : SIGTERM);
    auto t0 = Clock::now();
    int ws = 0;
    while (::waitpid(pid_, &ws, WNOHANG) == 0) {
      if (seconds_since(t0) > 5) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &ws, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pid_ = -1;
  }

  // SIGSTOP, SIGCONT: a stalled etcd, whose kernel still accepts connections and requests.
  void pause() { ::kill(pid_, SIGSTOP); }
  void resume() { ::kill(pid_, SIGCONT); }

  double startup_s() const { return startup_s_; }

 private:
  int client_port_, peer_port_;
  std::string dir_;
  pid_t pid_ = -1;
  double startup_s_ = 0;
};

bool have_etcd() { return ::access(kEtcdBinary, X_OK) == 0; }
#define SKIP_WITHOUT_ETCD() \
  if (!have_etcd()) GTEST_SKIP() << kEtcdBinary << " is missing: install etcd-server (scripts/setup.sh)"

// One etcd for every test that does not stop it; each test has a prefix of its own. Started by
// the first test that needs it, on the main thread (PR_SET_PDEATHSIG follows the forking thread).
std::unique_ptr<EtcdServer>& shared_slot() {
  static std::unique_ptr<EtcdServer> server;
  return server;
}
EtcdServer* shared_etcd() {
  static bool tried = false;
  if (!tried) {
    tried = true;
    auto server = std::make_unique<EtcdServer>();
    std::string err = server->start();
    if (err.empty()) {
      shared_slot() = std::move(server);
    } else {
      std::fprintf(stderr, "%s\n", err.c_str());
    }
  }
  return shared_slot().get();
}

// Stops the shared etcd when the test program ends (forked children _exit and never get here).
class EtcdEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { shared_slot().reset(); }
};
[[maybe_unused]] auto* const kEtcdEnvironment = ::testing::AddGlobalTestEnvironment(new EtcdEnvironment);

// A prefix no earlier test of this etcd used (the shared etcd outlives --gtest_repeat rounds).
std::string test_prefix() {
  static int runs = 0;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name() + "." + std::to_string(runs++);
  for (char& c : name)
    if (c == '/') c = '.';
  return "t/" + name;
}

// ---------------------------------------------------------------------------------------------
// The contract, for both stores, opened through their URLs.

class StoreContract : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "tcp") {
      server_ = std::make_unique<TcpStoreServer>("127.0.0.1", 0, "job1");
      url_ = "tcp://127.0.0.1:" + std::to_string(server_->port());
      location_ = "127.0.0.1:" + std::to_string(server_->port());
    } else if (GetParam() == "etcd") {
      SKIP_WITHOUT_ETCD();
      ASSERT_NE(shared_etcd(), nullptr) << "etcd did not start";
      url_ = "etcd://" + shared_etcd()->endpoint() + "/" + test_prefix();
      location_ = url_;
    } else {
      url_ = "file://" + dir_.path;
      location_ = dir_.path;
    }
  }
  std::unique_ptr<Store> open(const std::string& token = "job1", const std::string& round = "round0") {
    return make_store(url_, token, round, Millis(5000));
  }

  TempDir dir_;
  std::string url_, location_;
  std::unique_ptr<TcpStoreServer> server_;  // "tcp": this process serves, as rank 0 would
};

TEST_P(StoreContract, SetGetAddWaitCheck) {
  auto s = open();
  EXPECT_FALSE(s->check({"a"}));
  s->set("a", Bytes{1, 2, 3});
  EXPECT_TRUE(s->check({"a"}));
  EXPECT_EQ(s->get("a", Millis(10)), (Bytes{1, 2, 3}));
  s->set("a", Bytes{});  // last writer wins, empty values are values
  EXPECT_EQ(s->get("a", Millis(10)), Bytes{});
  EXPECT_TRUE(s->check({"a"}));
  s->set("gloo/1/rank 0", Bytes{7});  // keys may hold '/' and spaces
  EXPECT_EQ(s->get("gloo/1/rank 0", Millis(10)), Bytes{7});
  Bytes all(256);
  for (int i = 0; i < 256; ++i) all[i] = static_cast<uint8_t>(i);
  s->set("bytes", all);  // values are bytes, any length mod 3 (base64 padding in etcd)
  EXPECT_EQ(s->get("bytes", Millis(10)), all);
  for (size_t n : {1, 2, 4, 5}) {
    Bytes v(all.begin(), all.begin() + n);
    s->set("short", v);
    EXPECT_EQ(s->get("short", Millis(10)), v) << n;
  }
  EXPECT_EQ(s->add("n", 5), 5);
  EXPECT_EQ(s->add("n", -2), 3);
  auto v = s->get("n", Millis(10));
  EXPECT_EQ(std::string(v.begin(), v.end()), "3");
  s->wait({"a", "n"}, Millis(10));
  s->wait({}, Millis(0));
  EXPECT_TRUE(s->check({}));
  EXPECT_THROW(s->add("a", 1), StoreError);  // "a" holds no integer
  EXPECT_EQ(read_counter(*s, "n"), 3);       // read, not written
  EXPECT_EQ(read_counter(*s, "absent"), 0);
  EXPECT_FALSE(s->check({"absent"}));
  EXPECT_THROW(read_counter(*s, "a"), StoreError);

  // A key set later by another thread is seen by a waiting get and wait.
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    s->set("late", Bytes{9});
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    s->set("later", Bytes{10});
  });
  EXPECT_EQ(s->get("late", Millis(2000)), Bytes{9});
  s->wait({"late", "later"}, Millis(2000));
  setter.join();
}

TEST_P(StoreContract, TimeoutsNameKeys) {
  auto s = open();
  s->set("present", Bytes{1});
  auto t0 = Clock::now();
  try {
    s->get("absent_key", Millis(100));
    FAIL() << "no timeout";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "absent_key")) << e.what();
    EXPECT_TRUE(contains(e.what(), "100 ms")) << e.what();
    EXPECT_EQ(e.exit_code(), kExitPeer);
  }
  EXPECT_GE(seconds_since(t0), 0.095);
  EXPECT_LT(seconds_since(t0), 1.0);
  t0 = Clock::now();
  try {
    s->wait({"present", "missing_1", "missing_2"}, Millis(50));
    FAIL() << "no timeout";
  } catch (const StoreError& e) {
    std::string what = e.what();
    EXPECT_TRUE(contains(what, "missing_1")) << what;
    EXPECT_TRUE(contains(what, "missing_2")) << what;
    EXPECT_FALSE(contains(what, "present")) << what;
  }
  EXPECT_GE(seconds_since(t0), 0.045);
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_FALSE(s->check({"present", "missing_1"}));
}

TEST_P(StoreContract, ManyKeysInOneWait) {
  // More keys than etcd allows in one transaction (128).
  auto s = open();
  std::vector<std::string> keys;
  for (int i = 0; i < 300; ++i) keys.push_back("rank/" + std::to_string(i));
  for (int i = 0; i < 299; ++i) s->set(keys[i], Bytes{1});
  EXPECT_FALSE(s->check(keys));
  try {
    // Long enough for three 128-key etcd reads on a loaded machine: at 20 ms the first read itself
    // timed out under ctest -j2 on two cores, and the error named that read's keys, not rank/299.
    s->wait(keys, Millis(300));
    FAIL() << "no timeout";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "'rank/299'")) << e.what();
    EXPECT_FALSE(contains(e.what(), "'rank/298'")) << e.what();
  }
  s->set(keys[299], Bytes{1});
  EXPECT_TRUE(s->check(keys));
  s->wait(keys, Millis(100));
}

TEST_P(StoreContract, RoundsAreIsolated) {
  auto r0 = open("job1", "r0");
  auto r1 = open("job1", "r1");
  auto r10 = open("job1", "r10");  // "r1" is a prefix of "r10": still apart
  r0->set("a", Bytes{1});
  r1->set("agents/1", Bytes{2});
  EXPECT_FALSE(r1->check({"a"}));
  EXPECT_FALSE(r10->check({"a", "agents/1"}));
  EXPECT_THROW(r10->get("agents/1", Millis(10)), StoreError);
  EXPECT_EQ(r0->add("n", 1), 1);
  EXPECT_EQ(r1->add("n", 1), 1);
  EXPECT_EQ(r0->add("n", 1), 2);
  EXPECT_EQ(r10->list(""), std::vector<std::string>{});
  EXPECT_EQ(r1->list(""), (std::vector<std::string>{"agents/1", "n"}));
  auto again = open("job1", "r0");  // a second opener of a round sees its keys
  EXPECT_EQ(again->get("a", Millis(10)), Bytes{1});
}

TEST_P(StoreContract, ListByPrefix) {
  auto s = open();
  EXPECT_EQ(s->list(""), std::vector<std::string>{});
  for (std::string k : {"agents/10", "agents/2", "agents/1", "agentsX", "other", "we/ird %key"}) s->set(k, Bytes{});
  EXPECT_EQ(s->list("agents/"), (std::vector<std::string>{"agents/1", "agents/10", "agents/2"}));
  EXPECT_EQ(s->list("agents"), (std::vector<std::string>{"agents/1", "agents/10", "agents/2", "agentsX"}));
  EXPECT_EQ(s->list("we/"), std::vector<std::string>{"we/ird %key"});
  EXPECT_EQ(s->list("nothing"), std::vector<std::string>{});
  EXPECT_EQ(s->list("").size(), 6u);
}

// Refused without naming either token (RELIABILITY.md row 23: the token is never printed).
TEST_P(StoreContract, WrongJobTokenRefused) {
  auto a = open("job1", "r0");
  auto a2 = open("job1", "r1");  // same job, later round: fine
  try {
    open("secretB", "r0");
    FAIL() << "another job's token was accepted";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "wrong job token")) << e.what();
    EXPECT_FALSE(contains(e.what(), "job1")) << e.what();
    EXPECT_FALSE(contains(e.what(), "secretB")) << e.what();
    EXPECT_TRUE(contains(e.what(), location_)) << e.what();
  }
  for (const std::string bad : {"../evil", "se cret", ""}) {
    try {
      open(bad, "r0");
      ADD_FAILURE() << "invalid token accepted";
    } catch (const StoreError& e) {
      EXPECT_TRUE(contains(e.what(), "invalid job token")) << e.what();
      EXPECT_TRUE(bad.empty() || !contains(e.what(), bad)) << e.what();
    }
  }
  EXPECT_THROW(open("job1", ""), StoreError);
  EXPECT_THROW(open("job1", "a/b"), StoreError);
}

TEST_P(StoreContract, ConcurrentAddFromProcesses) {
  constexpr int kProcs = 4, kAdds = 50;
  open("job1", "r0");  // the job's claim exists before the race
  auto t0 = Clock::now();
  auto status = run_ranks(kProcs, [&](int rank) {
    auto s = open("job1", "r0");
    for (int i = 0; i < kAdds; ++i) s->add("counter", rank + 1);
    // Every process also takes one ticket: the tickets are exactly 1..kProcs.
    int64_t ticket = s->add("ticket", 1);
    REQUIRE(ticket >= 1 && ticket <= kProcs);
    s->set("ticket/" + std::to_string(ticket), Bytes{static_cast<uint8_t>(rank)});
    return 0;
  });
  double seconds = seconds_since(t0);
  expect_all_ok(status);
  auto s = open("job1", "r0");
  EXPECT_EQ(s->add("counter", 0), kAdds * (1 + 2 + 3 + 4));
  EXPECT_EQ(s->list("ticket/"), (std::vector<std::string>{"ticket/1", "ticket/2", "ticket/3", "ticket/4"}));
  std::printf("[ %s ] %d processes x %d contended adds: %.3f s\n", GetParam().c_str(), kProcs, kAdds + 1, seconds);
}

// Not a benchmark: a figure for the report, and a guard against a pathological slowdown
// (say, a new TCP connection per request).
TEST_P(StoreContract, Latency) {
  auto s = open();
  constexpr int kN = 200;
  auto t0 = Clock::now();
  for (int i = 0; i < kN; ++i) s->set("k", Bytes(64, 1));
  double set_ms = seconds_since(t0) * 1000 / kN;
  t0 = Clock::now();
  for (int i = 0; i < kN; ++i) s->get("k", Millis(1000));
  double get_ms = seconds_since(t0) * 1000 / kN;
  t0 = Clock::now();
  for (int i = 0; i < kN; ++i) s->add("n", 1);
  double add_ms = seconds_since(t0) * 1000 / kN;
  t0 = Clock::now();
  for (int i = 0; i < kN; ++i) s->check({"k", "n"});
  double check_ms = seconds_since(t0) * 1000 / kN;
  std::printf("[ %s ] per op: set %.3f ms, get %.3f ms, add %.3f ms (uncontended), check(2 keys) %.3f ms\n",
              GetParam().c_str(), set_ms, get_ms, add_ms, check_ms);
  EXPECT_LT(set_ms + get_ms + add_ms + check_ms, 100.0);
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreContract, ::testing::Values("file", "etcd", "tcp"),
                         [](const auto& param_info) { return param_info.param; });

// ---------------------------------------------------------------------------------------------
// etcd only

bool has(const std::vector<std::string>& keys, const std::string& k) {
  return std::find(keys.begin(), keys.end(), k) != keys.end();
}

TEST(EtcdStore, LeasedKeysLiveWithTheirHolder) {
  SKIP_WITHOUT_ETCD();
  ASSERT_NE(shared_etcd(), nullptr);
  std::string endpoint = shared_etcd()->endpoint(), prefix = test_prefix();
  auto s = make_etcd_store(endpoint, prefix, "job", "r0", Millis(5000));

  // A process that announces itself and dies without a word.
  auto status = run_ranks(1, [&](int rank) {
    auto store = make_etcd_store(endpoint, prefix, "job", "r0", Millis(5000));
    auto lease = store->grant_lease(Millis(2000));
    store->set_with_lease("agents/dead", Bytes{1}, *lease);
    REQUIRE(store->check({"agents/dead"}));
    ::kill(::getpid(), SIGKILL);
    return 1;
  });
  ASSERT_EQ(status[0], 128 + SIGKILL);
  auto t0 = Clock::now();

  auto kept = s->grant_lease(Millis(1500));  // rounded up to 2 s
  EXPECT_EQ(kept->ttl(), Millis(2000));
  s->set_with_lease("agents/kept", Bytes{2}, *kept);
  auto hung = s->grant_lease(Millis(2000));
  s->set_with_lease("agents/hung", Bytes{3}, *hung);
  hung->stop_renewing();
  auto revoked = s->grant_lease(Millis(2000));
  s->set_with_lease("agents/revoked", Bytes{4}, *revoked);
  s->set("agents/unleased", Bytes{5});
  EXPECT_EQ(s->list("agents/"), (std::vector<std::string>{"agents/dead", "agents/hung", "agents/kept", "agents/revoked",
                                                          "agents/unleased"}));
  revoked.reset();  // revoked on destruction: gone at once
  EXPECT_FALSE(has(s->list("agents/"), "agents/revoked"));

  // Poll until 3.5 s (well past one TTL): the dead and the hung vanish, the kept one stays.
  double dead_gone = -1, hung_gone = -1;
  while (seconds_since(t0) < 3.5) {
    auto alive = s->list("agents/");
    ASSERT_TRUE(has(alive, "agents/kept")) << "a renewed lease expired at " << seconds_since(t0) << " s";
    ASSERT_TRUE(has(alive, "agents/unleased"));
    if (dead_gone < 0 && !has(alive, "agents/dead")) dead_gone = seconds_since(t0);
    if (hung_gone < 0 && !has(alive, "agents/hung")) hung_gone = seconds_since(t0);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::printf("[ etcd ] ttl 2 s: the killed process's key went after %.2f s, the hung holder's after %.2f s\n",
              dead_gone, hung_gone);
  EXPECT_GT(dead_gone, 0) << "the dead process's key outlived its lease";
  EXPECT_GT(hung_gone, 1.0) << "expired before its TTL";
  EXPECT_LT(hung_gone, 3.5);
  EXPECT_TRUE(kept->alive());
  EXPECT_EQ(s->get("agents/kept", Millis(10)), Bytes{2});
  // An expired lease can no longer carry keys.
  EXPECT_THROW(s->set_with_lease("agents/hung", Bytes{3}, *hung), StoreError);
  kept.reset();
  EXPECT_EQ(s->list("agents/"), std::vector<std::string>{"agents/unleased"});
}

// RELIABILITY.md row 8: an etcd restarted mid-run. Operations wait through the outage when it
// ends within their timeout; otherwise they fail naming the endpoint and the key.
TEST(EtcdStore, SurvivesRestartWithinTimeout) {
  SKIP_WITHOUT_ETCD();
  EtcdServer server;
  ASSERT_EQ(server.start(), "");
  std::string endpoint = server.endpoint();
  auto patient = make_etcd_store(endpoint, "job-prefix", "job", "r0", Millis(10000));
  auto hasty = make_etcd_store(endpoint, "job-prefix", "job", "r0", Millis(300));
  patient->set("before", Bytes{1});
  EXPECT_EQ(patient->add("n", 1), 1);
  auto lease = patient->grant_lease(Millis(5000));
  patient->set_with_lease("agents/0", Bytes{1}, *lease);

  server.stop(/*kill_now=*/true);  // a crash: no goodbye to open connections
  auto expect_unreachable = [&](const std::function<void()>& op, const std::string& key) {
    auto t0 = Clock::now();
    try {
      op();
      ADD_FAILURE() << "succeeded with etcd down";
    } catch (const StoreError& e) {
      EXPECT_TRUE(contains(e.what(), endpoint)) << e.what();
      EXPECT_TRUE(contains(e.what(), "'" + key + "'")) << e.what();
      EXPECT_TRUE(contains(e.what(), "300 ms")) << e.what();
    }
    EXPECT_GE(seconds_since(t0), 0.29);
    EXPECT_LT(seconds_since(t0), 1.5);
  };
  expect_unreachable([&] { hasty->set("x", Bytes{1}); }, "x");
  expect_unreachable([&] { hasty->get("before", Millis(300)); }, "before");
  expect_unreachable([&] { hasty->add("n", 1); }, "n");
  expect_unreachable([&] { hasty->wait({"before"}, Millis(300)); }, "before");
  try {
    make_etcd_store(endpoint, "job-prefix", "job", "r1", Millis(300));
    ADD_FAILURE() << "opened with etcd down";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), endpoint)) << e.what();
    EXPECT_TRUE(contains(e.what(), "/job-prefix/job")) << e.what();
  }

  // Back after ~1 s: operations begun while it was down complete. The operations run on a
  // thread; etcd is restarted from this one, since etcd dies with the thread that forked it.
  constexpr double kDown = 1.0;
  auto t_down = Clock::now();
  Bytes got;
  int64_t added = 0;
  double recovered = -1;
  std::string op_error;
  std::thread ops([&] {
    try {
      got = patient->get("before", Millis(10000));
      recovered = seconds_since(t_down);
      patient->set("during", Bytes{2});
      added = patient->add("n", 1);
      patient->wait({"before", "during", "agents/0"}, Millis(1000));
    } catch (const StoreError& e) {
      op_error = e.what();
    }
  });
  // An add and a set begun during the outage, beside the get (the store takes several threads).
  int64_t added_during = 0;
  std::string add_error;
  std::thread adder([&] {
    try {
      added_during = patient->add("m", 7);
      patient->set("set during", Bytes{3});
    } catch (const StoreError& e) {
      add_error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::duration<double>(kDown));
  std::string restart_error = server.start();
  ops.join();
  adder.join();
  ASSERT_EQ(restart_error, "");
  EXPECT_EQ(op_error, "");
  EXPECT_EQ(add_error, "");
  EXPECT_EQ(added_during, 7);
  EXPECT_EQ(patient->get("set during", Millis(10)), Bytes{3});
  EXPECT_EQ(got, Bytes{1});
  EXPECT_EQ(added, 2);  // the first add was kept, this one counted once
  EXPECT_GE(recovered, kDown);
  EXPECT_TRUE(lease->alive());  // renewed across the outage
  EXPECT_EQ(patient->list("agents/"), std::vector<std::string>{"agents/0"});
  std::printf(
      "[ etcd ] down %.1f s, restart took %.2f s; a get begun during the outage returned %.2f s after "
      "the crash\n",
      kDown, server.startup_s(), recovered);
}

// An HTTP server on loopback that answers the first `answered` requests with a transaction that
// succeeded, then reads each later request and closes the connection without a reply: an etcd
// that dies after receiving a request, when nobody can know whether it was applied.
class DroppingServer {
 public:
  explicit DroppingServer(int answered) : answered_(answered) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd_, 8) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      std::abort();
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~DroppingServer() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
    std::lock_guard<std::mutex> lock(mu_);
    for (int c : conns_) ::shutdown(c, SHUT_RDWR);
    for (auto& t : handlers_) t.join();
    for (int c : conns_) ::close(c);
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  int requests() const { return requests_; }

 private:
  void serve() {  // a thread per connection: curl opens a fresh one while the old is kept alive
    for (;;) {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::lock_guard<std::mutex> lock(mu_);
      conns_.push_back(c);
      handlers_.emplace_back([this, c] { handle(c); });
    }
  }

  void handle(int c) {
    std::string in;
    char buf[4096];
    for (;;) {  // one request after another on a kept-alive connection
      size_t head = in.find("\r\n\r\n");
      size_t cl = in.find("Content-Length: ");
      if (head != std::string::npos && cl != std::string::npos) {
        size_t total = head + 4 + std::stoul(in.substr(cl + 16));
        if (in.size() >= total) {
          in.erase(0, total);
          if (++requests_ > answered_) break;
          std::string body = R"({"header":{},"succeeded":true})";
          std::string reply =
              "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
              "\r\n\r\n" + body;
          if (::write(c, reply.data(), reply.size()) != static_cast<ssize_t>(reply.size())) break;
          continue;
        }
      }
      ssize_t n = ::read(c, buf, sizeof(buf));
      if (n <= 0) break;
      in.append(buf, static_cast<size_t>(n));
    }
    ::shutdown(c, SHUT_RDWR);  // closed by the destructor, which may still shut it down
  }

  int answered_;
  int fd_ = -1, port_ = 0;
  std::atomic<int> requests_{0};
  std::thread thread_;
  std::mutex mu_;
  std::vector<int> conns_;
  std::vector<std::thread> handlers_;
};

// add() is not idempotent: when the connection breaks after the request left, a retry could
// count twice, so it fails at once and says so; set() is retried until its timeout.
TEST(EtcdStore, AddNeverRetriesARequestThatMayHaveBeenApplied) {
  DroppingServer server(/*answered=*/1);  // the token transaction of make_etcd_store
  auto s = make_etcd_store(server.endpoint(), "p", "job", "r0", Millis(300));
  auto t0 = Clock::now();
  try {
    s->add("n", 1);
    FAIL() << "add() succeeded against a server that never answers";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "may or may not have been applied")) << e.what();
    EXPECT_TRUE(contains(e.what(), "'n'")) << e.what();
    EXPECT_TRUE(contains(e.what(), server.endpoint())) << e.what();
  }
  EXPECT_LT(seconds_since(t0), 0.2);
  EXPECT_EQ(server.requests(), 2);  // sent once, never again
  // add(key, 0) only reads the counter: retried until its timeout, as a read is (an agent polls
  // its round's failure counter this way through an etcd restart).
  t0 = Clock::now();
  try {
    s->add("n", 0);
    FAIL() << "add(0) succeeded against a server that never answers";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "within 300 ms")) << e.what();
  }
  EXPECT_GE(seconds_since(t0), 0.29);
  EXPECT_GT(server.requests(), 3);
  t0 = Clock::now();
  try {
    s->set("k", Bytes{1});
    FAIL() << "set() succeeded against a server that never answers";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "within 300 ms")) << e.what();
    EXPECT_TRUE(contains(e.what(), "'k'")) << e.what();
  }
  EXPECT_GE(seconds_since(t0), 0.29);
  EXPECT_GT(server.requests(), 3);  // retried
}

TEST(EtcdStore, UnreachableEndpointNamed) {
  int port = free_port();  // nothing listens there
  std::string endpoint = "127.0.0.1:" + std::to_string(port);
  auto t0 = Clock::now();
  try {
    make_etcd_store(endpoint, "p", "job", "r0", Millis(200));
    FAIL() << "opened a store with no etcd";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), endpoint)) << e.what();
    EXPECT_TRUE(contains(e.what(), "'/p/job'")) << e.what();
  }
  EXPECT_GE(seconds_since(t0), 0.19);
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_THROW(make_etcd_store("nocolon", "p", "job", "r0", Millis(10)), StoreError);
  EXPECT_THROW(make_etcd_store(endpoint, "", "job", "r0", Millis(10)), StoreError);
  EXPECT_THROW(make_etcd_store(endpoint, "a/../b", "job", "r0", Millis(10)), StoreError);
}

// A wait whose deadline passes while a request is in flight (etcd stalled, not gone) reports its
// own timeout and the keys still missing, as when the deadline passes between two requests; an
// etcd that refuses connections for the whole wait is "cannot reach etcd".
TEST(EtcdStore, WaitCutOffMidRequestNamesTheMissingKeys) {
  SKIP_WITHOUT_ETCD();
  EtcdServer server;
  ASSERT_EQ(server.start(), "");
  auto s = make_etcd_store(server.endpoint(), "p", "job", "r0", Millis(5000));
  s->set("present", Bytes{1});
  // Stalled after the wait's first polls found "present": a later poll hangs until the deadline.
  std::thread staller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    server.pause();
  });
  auto t0 = Clock::now();
  try {
    s->wait({"present", "missing"}, Millis(1000));
    ADD_FAILURE() << "wait() succeeded without the key";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "timed out after 1000 ms waiting for key(s) 'missing'")) << e.what();
    EXPECT_FALSE(contains(e.what(), "'present'")) << e.what();
    EXPECT_FALSE(contains(e.what(), "cannot reach")) << e.what();
  }
  EXPECT_GE(seconds_since(t0), 0.99);
  EXPECT_LT(seconds_since(t0), 2.0);
  staller.join();
  server.resume();
  server.stop(/*kill_now=*/true);
  t0 = Clock::now();
  try {
    s->wait({"present", "missing"}, Millis(300));
    ADD_FAILURE() << "wait() succeeded with etcd down";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "cannot reach etcd")) << e.what();
    EXPECT_TRUE(contains(e.what(), server.endpoint())) << e.what();
    EXPECT_TRUE(contains(e.what(), "'missing'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "300 ms")) << e.what();
  }
  EXPECT_GE(seconds_since(t0), 0.29);
  EXPECT_LT(seconds_since(t0), 1.5);
}

// ---------------------------------------------------------------------------------------------
// The etcd gateway's replies (etcd_reply.h): what fuzz/etcd_reply_fuzz.cc found

// The store sleeps on a lease in milliseconds: a TTL of 2^63 - 1 s became TTL x 1000, a signed
// overflow. etcd grants at most 9,000,000,000 s.
TEST(EtcdReply, LeaseGrantBeyondEtcdsLongestTtlRefused) {
  for (const char* ttl : {"9223372036854775807", "9223372036854776", "9000000001"}) {
    try {
      etcd::lease_grant({{"ID", "7587862071147474180"}, {"TTL", ttl}}, "etcd://e:2379/p");
      ADD_FAILURE() << "granted TTL " << ttl;
    } catch (const StoreError& e) {
      EXPECT_TRUE(contains(e.what(), std::string("TTL ") + ttl)) << e.what();
      EXPECT_TRUE(contains(e.what(), "etcd://e:2379/p")) << e.what();
    }
  }
  const etcd::Grant g = etcd::lease_grant({{"ID", "7587862071147474180"}, {"TTL", "9000000000"}}, "etcd://e:2379/p");
  EXPECT_EQ(g.id, 7587862071147474180);
  EXPECT_EQ(g.ttl_s, 9000000000);
}

// A malformed reply was echoed in the error with dump(), which recurses as deep as the reply
// nests: 100000 brackets overflowed the stack.
TEST(EtcdReply, MalformedRepliesAreNotEchoed) {
  const std::string deep =
      R"({"succeeded":true,"responses":)" + std::string(100000, '[') + std::string(100000, ']') + "}";
  const etcd::json reply = parse_json_or_throw(deep);
  try {
    etcd::txn_exists(reply, 2, "etcd://e:2379/p");
    ADD_FAILURE() << "a transaction without its 2 responses was read";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "a transaction of 2 ranges answered 1 response")) << e.what();
  }
  try {
    etcd::lease_grant(reply, "etcd://e:2379/p");
    ADD_FAILURE() << "a lease without ID was granted";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "lease grant answered ID 0, TTL 0")) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// URLs

TEST(StoreUrl, Parses) {
  StoreUrl u = parse_store_url("etcd://10.0.0.7:2379/tessera/runs");
  EXPECT_EQ(u.kind, StoreUrl::Kind::kEtcd);
  EXPECT_EQ(u.endpoint, "10.0.0.7:2379");
  EXPECT_EQ(u.prefix, "tessera/runs");
  u = parse_store_url("etcd://etcd.svc.cluster.local:2379/p/");
  EXPECT_EQ(u.endpoint, "etcd.svc.cluster.local:2379");
  EXPECT_EQ(u.prefix, "p");
  u = parse_store_url("etcd://[::1]:2379/p");
  EXPECT_EQ(u.endpoint, "[::1]:2379");
  u = parse_store_url("file:///shared/rdzv");
  EXPECT_EQ(u.kind, StoreUrl::Kind::kFile);
  EXPECT_EQ(u.dir, "/shared/rdzv");
  u = parse_store_url("file://relative/dir");
  EXPECT_EQ(u.dir, "relative/dir");
}

TEST(StoreUrl, RejectsNamingTheUrl) {
  for (std::string url : {"", "etcd://", "etcd://host:2379", "etcd://host:2379/", "etcd://host/p", "etcd://:2379/p",
                          "etcd://host:0/p", "etcd://host:65536/p", "etcd://host:23x9/p", "etcd://host:2379/a/../b",
                          "etcd://host:2379/p?x=1", "etcd://user@host:2379/p", "etcd://::1:2379/p", "file://",
                          "http://host:2379/p", "/some/dir", "redis://host:6379/p"}) {
    try {
      parse_store_url(url);
      ADD_FAILURE() << "accepted '" << url << "'";
    } catch (const ConfigError& e) {
      EXPECT_TRUE(contains(e.what(), "'" + url + "'")) << e.what();
      EXPECT_EQ(e.exit_code(), kExitConfig);
    }
  }
  EXPECT_THROW(make_store("nope://x", "job", "r0", Millis(10)), ConfigError);
}

TEST(StoreUrl, FileUrlOpensTheFileStore) {
  TempDir dir;
  auto s = make_store("file://" + dir.path, "job", "r0", Millis(10));
  s->set("k", Bytes{1});
  EXPECT_TRUE(std::filesystem::exists(dir.path + "/" + auth::job_namespace("job") + "/r0/k_k"));
  EXPECT_EQ(dynamic_cast<EtcdStore*>(s.get()), nullptr);
}

}  // namespace
}  // namespace tessera::comm
