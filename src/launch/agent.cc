// The per-node agent of `tessera launch`: rendezvous rounds, workers, watchdog, restarts.
#include "launch/agent.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "checkpoint/directory.h"
#include "comm/job_auth.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/heartbeat.h"
#include "core/host.h"
#include "core/log.h"
#include "core/run_lock.h"
#include "core/signals.h"
#include "core/threads.h"
#include "core/timer.h"
#include "data/bundled.h"
#include "launch/progress.h"

extern char** environ;

namespace tessera::launch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  const int sig = WTERMSIG(status);
  return fmt::format("signal {} ({})", sig, sigabbrev_np(sig) != nullptr ? sigabbrev_np(sig) : "?");
}
int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }
// Configuration, data and health-check failures (2 to 4) fail the same way every time.
bool restartable(int code) { return code < kExitConfig || code > kExitHealth; }

struct Worker {
  int rank = 0, local_rank = 0;
  pid_t pid = -1;
  bool exited = false;
  int status = 0;
  std::string heartbeat;  // file path
  ProgressWatch watch{0, 0};
  bool term_sent = false;
  bool hung = false;  // the watchdog sent the SIGTERM
  std::string hung_why;
  Clock::time_point term_at;
};

// A round number or node count the store holds; a StoreError naming the key when it is not one
// (a damaged or hostile store must end in a clear error, not std::terminate).
int stored_count(const comm::Bytes& value, const std::string& key) {
  const std::string text(value.begin(), value.end());
  int n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || n < 0) {
    throw comm::StoreError(fmt::format("the store's key '{}' holds \"{}\", not a count", key, text.substr(0, 32)));
  }
  return n;
}

constexpr const char* kHeartbeatPrefix = "tessera-heartbeats.";

// Removes the heartbeat directories in `tmp` that agents of this user on this host left when they
// were killed (kill -9 skips every destructor): a real directory owned by this user whose
// agent.pid names this host and a process that no longer exists. Anything else is left alone.
void remove_stale_heartbeat_dirs(const fs::path& tmp) {
  const std::string host = host_name();
  std::error_code ec;
  for (fs::directory_iterator it(tmp, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path dir = it->path();
    struct stat st {};
    if (dir.filename().string().rfind(kHeartbeatPrefix, 0) != 0 || ::lstat(dir.c_str(), &st) != 0 ||
        !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
      continue;
    }
    std::ifstream in(dir / "agent.pid");
    std::string owner_host;
    long pid = 0;
    if (!(in >> owner_host >> pid) || owner_host != host || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code removed;
    fs::remove_all(dir, removed);
  }
}

// A private directory for this agent's heartbeat files (mkdtemp: a fresh name, mode 0700, so no
// other local user can plant a symlink where a heartbeat file will be written), with agent.pid
// ("HOST PID") so that a later agent can remove it if this one is killed.
std::string make_heartbeat_dir() {
  const fs::path tmp = fs::temp_directory_path();
  remove_stale_heartbeat_dirs(tmp);
  std::string dir = (tmp / (std::string(kHeartbeatPrefix) + "XXXXXX")).string();
  if (::mkdtemp(dir.data()) == nullptr) {
    throw IoError(fmt::format("cannot create a heartbeat directory {}: {}", dir, std::strerror(errno)));
  }
  write_file_atomic(dir + "/agent.pid", fmt::format("{} {}\n", host_name(), ::getpid()));
  return dir;
}

class Agent {
 public:
  explicit Agent(const LaunchOptions& o) : o_(o) {}
  int run();

 private:
  enum class Outcome { kDone, kFailed, kRejoin, kStopped };
  struct Round {
    int index = 0, node_rank = 0, nodes = 0;
  };

  std::string key(int r, const char* what) const { return fmt::format("rdzv.{}.{}", r, what); }
  int64_t counter(int r, const char* what) { return store_->add(key(r, what), 0); }
  bool join(int r, Round* out);
  // Joins round *r, or the next open one (moving *r on) when it closed before this agent came;
  // false when this agent should exit 0 instead: a stop request, or the job finished meanwhile.
  bool join_open_round(int* r, Round* round);
  // Whether round r will never go on: its agents ended it (done, stopped, gave up, a failure not
  // worth restarting) or are gone (none bumped the round's beat counter for a few monitor ticks).
  // A relaunched agent then starts a new generation in round r + 1 instead of waiting as a late
  // node for a round that will never come.
  bool round_over(int r);
  // Bumps round r's beat counter. Any change of it counts as a sign of life, so an increment lost
  // or applied twice while the store is briefly unreachable is harmless: the next tick tries again
  // (and the monitor's reads wait out an outage or fail on it).
  void beat(int r);
  // Marks round r ended for good (best effort: a relaunch also detects a silent round).
  int end_round(int r, int exit_code);
  void start_workers(const Round& round, int restart_count);
  // A worker's command line (the config checked for this world size first: exit 2 here) and
  // environment (the agent's, with the TESSERA_* variables of the worker's place in the job).
  std::vector<std::string> worker_args(int world) const;
  std::vector<std::string> worker_environment(const Worker& w, const Round& round, int restart_count) const;
  // Watches the round's workers and the job until the round ends, one tick each
  // --monitor-interval; the parts of a tick follow.
  Outcome monitor(const Round& round);
  Worker* reap_exited();  // the worker whose failure is the cause, or null
  Outcome fail_round(const Worker& failed, const Round& round);
  void watch_heartbeats(int r);  // SIGTERM to a worker without progress, SIGKILL after the grace
  std::optional<Outcome> outcome_when_exited(int r);
  // Another node's failure or a lost agent, a stop request, or a late node to take in.
  std::optional<Outcome> follow_the_job(const Round& round);
  void kill_workers(int signo);
  void record_failure(const Worker& w, const Round& round);
  void record_cause(int r, int code, const std::string& summary, bool consequence);
  // With etcd: this agent's key in the round, leased, so that the others see it vanish when the
  // agent dies or stops renewing; false when an agent of the round is gone.
  void announce(const Round& round);
  bool all_agents_alive(const Round& round);
  std::pair<int, std::string> read_failure(int r);  // exit code and summary of round r's cause
  void reap_all();
  std::string worker_summary(const Worker& w, const Round& round) const;

  LaunchOptions o_;
  std::unique_ptr<comm::Store> store_;
  std::string heartbeat_dir_;
  std::vector<Worker> workers_;
  std::unique_ptr<comm::EtcdLease> lease_;
  int alive_seen_ = 0;  // the most agents seen alive in the current round
  Clock::time_point round_start_;
  bool forwarded_stop_ = false;
};

bool Agent::join(int r, Round* out) {
  const int64_t index = store_->add(key(r, "joined"), 1) - 1;
  const std::string round_text = std::to_string(r);
  store_->set("current", comm::Bytes(round_text.begin(), round_text.end()));
  const comm::Millis timeout(static_cast<int64_t>(o_.rdzv_timeout_s * 1000));
  const Clock::time_point t0 = Clock::now();
  if (index == 0) {  // the first agent closes the round
    while (counter(r, "joined") < o_.min_nodes) {
      if (seconds_since(t0) > o_.rdzv_timeout_s) {
        throw comm::StoreError(fmt::format("rendezvous round {}: only {} of at least {} nodes joined within {:.0f} s "
                                           "(--nnodes {}:{}); start the other agents with the same --rdzv, --run-id "
                                           "and TESSERA_JOB_TOKEN",
                                           r, counter(r, "joined"), o_.min_nodes, o_.rdzv_timeout_s, o_.min_nodes,
                                           o_.max_nodes));
      }
      if (StopSignals::received() != 0) return false;
      sleep_s(0.05);
    }
    const Clock::time_point enough = Clock::now();
    while (counter(r, "joined") < o_.max_nodes && seconds_since(enough) < o_.last_call_s) sleep_s(0.05);
    const int64_t nodes = std::min<int64_t>(counter(r, "joined"), o_.max_nodes);
    const std::string text = std::to_string(nodes);
    store_->set(key(r, "nodes"), comm::Bytes(text.begin(), text.end()));
  }
  const comm::Bytes nodes = store_->get(key(r, "nodes"), timeout);
  out->index = r;
  out->node_rank = static_cast<int>(index);
  out->nodes = stored_count(nodes, key(r, "nodes"));
  return index < out->nodes;
}

bool Agent::round_over(int r) {
  if (counter(r, "ended") > 0) return true;
  const int64_t beat = counter(r, "beat");
  const Clock::time_point t0 = Clock::now();
  while (seconds_since(t0) < std::max(2.0, 4 * o_.monitor_interval_s)) {
    if (StopSignals::received() != 0 || counter(r, "beat") != beat) return false;
    sleep_s(0.1);
  }
  return true;
}

void Agent::beat(int r) {
  try {
    store_->add(key(r, "beat"), 1);
  } catch (const comm::StoreError&) {
  }
}

int Agent::end_round(int r, int exit_code) {
  try {
    store_->add(key(r, "ended"), 1);
  } catch (const comm::StoreError& e) {
    log::warn("cannot mark round {} ended in the store: {}", r, e.what());
  }
  return exit_code;
}

std::vector<std::string> Agent::worker_args(int world) const {
  // Validated for this world size before any worker starts: a bad config is exit 2 here.
  config::Overrides overrides = o_.overrides;
  overrides.emplace_back("parallel.nproc", std::to_string(world));
  config::Config c = config::load(o_.config_path, overrides);
  if (c.train.threads == 0) {
    set_num_threads(0);
    overrides.emplace_back("train.threads", std::to_string(std::max(1, num_threads() / o_.nproc_per_node)));
  }
  std::vector<std::string> args = {"tessera", "train"};
  if (!o_.config_path.empty()) args.push_back(o_.config_path);
  for (const auto& [k, v] : overrides) args.insert(args.end(), {"--set", k + "=" + v});
  args.insert(args.end(), {"--run-dir", o_.run_dir, "--resume", o_.resume});
  return args;
}

std::vector<std::string> Agent::worker_environment(const Worker& w, const Round& round, int restart_count) const {
  const std::vector<std::pair<std::string, std::string>> vars = {
      {"TESSERA_RANK", std::to_string(w.rank)},
      {"TESSERA_LOCAL_RANK", std::to_string(w.local_rank)},
      {"TESSERA_LOCAL_WORLD_SIZE", std::to_string(o_.nproc_per_node)},
      {"TESSERA_WORLD_SIZE", std::to_string(round.nodes * o_.nproc_per_node)},
      {"TESSERA_NODE_RANK", std::to_string(round.node_rank)},
      {"TESSERA_RDZV", o_.rdzv},
      {"TESSERA_JOB_TOKEN", o_.job_token},
      {"TESSERA_ROUND", fmt::format("{}.{}", o_.run_id, round.index)},
      {"TESSERA_RESTART_COUNT", std::to_string(restart_count)},
      {"TESSERA_HEARTBEAT", w.heartbeat},
      {"TESSERA_HOST", o_.host}};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const auto& [k, v] : vars) replaced = replaced || entry.rfind(k + "=", 0) == 0;
    if (!replaced) env.push_back(entry);
  }
  for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
  return env;
}

void Agent::start_workers(const Round& round, int restart_count) {
  std::vector<std::string> args = worker_args(round.nodes * o_.nproc_per_node);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  workers_.clear();
  round_start_ = Clock::now();
  for (int local = 0; local < o_.nproc_per_node; ++local) {
    Worker w;
    w.local_rank = local;
    w.rank = round.node_rank * o_.nproc_per_node + local;
    w.heartbeat = fmt::format("{}/rank{}", heartbeat_dir_, w.rank);
    const int fd = ::open(w.heartbeat.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    const std::string first = heartbeat::step_line(0);  // no step yet: the worker's own first line
    const bool written = fd >= 0 && ::write(fd, first.data(), first.size()) == static_cast<ssize_t>(first.size());
    if (fd >= 0) ::close(fd);
    if (!written)
      throw IoError(fmt::format("cannot write the heartbeat file {}: {}", w.heartbeat, std::strerror(errno)));
    w.watch = ProgressWatch(o_.hang_timeout_s, o_.gpu_idle_timeout_s);
    w.watch.read(first, seconds_since(round_start_));
    // The environment is built before fork: the child may only call async-signal-safe functions.
    std::vector<std::string> env = worker_environment(w, round, restart_count);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const pid_t agent = getpid();
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) throw Error(fmt::format("cannot start worker {}: fork failed: {}", w.rank, std::strerror(errno)), kExitFailure);
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // a worker never outlives its agent
      if (getppid() != agent) _exit(kExitPeer);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);  // the agent blocks TERM/INT for its signal thread
      execve("/proc/self/exe", argv.data(), envp.data());
      _exit(127);
    }
    w.pid = pid;
    workers_.push_back(w);
  }
}

std::string Agent::worker_summary(const Worker& w, const Round& round) const {
  const heartbeat::Beat beat = heartbeat::parse(try_read_file(w.heartbeat).bytes);
  return fmt::format("rank {} (node {}, local rank {}, pid {}): {} after step {}{}, {} ({:.1f} s into round {})",
                     w.rank, round.node_rank, w.local_rank, w.pid, describe_status(w.status), beat.step,
                     beat.finishing ? " (its last: finishing the run)" : "", utc_now(), seconds_since(round_start_),
                     round.index);
}

void Agent::record_failure(const Worker& w, const Round& round) {
  const std::string summary = worker_summary(w, round);
  log::error("round {}: worker {}", round.index, summary);
  record_cause(round.index, exit_code_of(w.status), summary, exit_code_of(w.status) == kExitPeer);
}

void Agent::record_cause(int r, int code, const std::string& summary, bool consequence) {
  // A worker that lost a peer (exit 12) is a consequence; the summary that counts is the first
  // other failure (a kill, a hang, an error, a lost agent), which may be recorded a moment later.
  const char* kind = consequence ? "peer" : "cause";
  if (store_->add(key(r, kind), 1) == 1) {
    const std::string record = fmt::format("{} {}", code, summary);
    store_->set(key(r, consequence ? "peer_failure" : "failure"), comm::Bytes(record.begin(), record.end()));
  }
  store_->add(key(r, "failed"), 1);
}

void Agent::announce(const Round& round) {
  auto* etcd = dynamic_cast<comm::EtcdStore*>(store_.get());
  if (etcd == nullptr) return;  // the file store has no liveness: lost agents show as lost workers
  if (!lease_) lease_ = etcd->grant_lease(comm::Millis(static_cast<int64_t>(o_.agent_ttl_s * 1000)));
  const std::string host = o_.host + " pid " + std::to_string(getpid());
  etcd->set_with_lease(fmt::format("rdzv.{}.alive.{}", round.index, round.node_rank),
                       comm::Bytes(host.begin(), host.end()), *lease_);
}

bool Agent::all_agents_alive(const Round& round) {
  if (lease_ == nullptr) return true;
  const std::vector<std::string> alive = store_->list(fmt::format("rdzv.{}.alive.", round.index));
  const int seen = static_cast<int>(alive.size());
  // Agents announce themselves as they start their workers: until every one has (or a lease's
  // time has passed), a short count means "not yet", not "gone".
  const bool settled = alive_seen_ >= round.nodes || seconds_since(round_start_) > o_.agent_ttl_s;
  alive_seen_ = std::max(alive_seen_, seen);
  if (seen >= round.nodes || (seen >= alive_seen_ && !settled)) return true;
  const std::string summary = fmt::format("the agent of {} of {} node(s) is gone (its lease of {:.0f} s expired), {}",
                                          round.nodes - static_cast<int>(alive.size()), round.nodes, o_.agent_ttl_s,
                                          utc_now());
  log::error("round {}: {}", round.index, summary);
  record_cause(round.index, kExitPeer, summary, false);
  return false;
}

std::pair<int, std::string> Agent::read_failure(int r) {
  const Clock::time_point t0 = Clock::now();
  const double wait_s = std::max(1.0, 3 * o_.monitor_interval_s);
  std::string record;
  for (;;) {
    const bool cause = store_->check({key(r, "failure")});
    if (cause || (seconds_since(t0) > wait_s && store_->check({key(r, "peer_failure")}))) {
      const comm::Bytes b = store_->get(key(r, cause ? "failure" : "peer_failure"), comm::Millis(1000));
      record.assign(b.begin(), b.end());
      break;
    }
    if (seconds_since(t0) > o_.rdzv_timeout_s) return {kExitFailure, "(no failure was recorded)"};
    sleep_s(0.05);
  }
  const size_t space = record.find(' ');
  return {std::atoi(record.substr(0, space).c_str()), record.substr(space + 1)};
}

void Agent::kill_workers(int signo) {
  for (Worker& w : workers_) {
    if (!w.exited) kill(w.pid, signo);
  }
}

void Agent::reap_all() {
  for (Worker& w : workers_) {
    if (w.exited) continue;
    waitpid(w.pid, &w.status, 0);
    w.exited = true;
  }
}

Agent::Outcome Agent::monitor(const Round& round) {
  for (;;) {
    sleep_s(o_.monitor_interval_s);
    beat(round.index);  // this round is alive (round_over)
    if (Worker* failed = reap_exited()) return fail_round(*failed, round);
    watch_heartbeats(round.index);
    if (const std::optional<Outcome> end = outcome_when_exited(round.index)) return *end;
    if (const std::optional<Outcome> end = follow_the_job(round)) return *end;
  }
}

Worker* Agent::reap_exited() {
  // Of the failures seen in one tick, a worker that lost a peer (exit 12) is the consequence of
  // another's; the other is recorded as the cause.
  Worker* failed = nullptr;
  for (Worker& w : workers_) {
    if (w.exited || waitpid(w.pid, &w.status, WNOHANG) != w.pid) continue;
    w.exited = true;
    if (w.status == 0 || forwarded_stop_) continue;
    if (failed == nullptr || (exit_code_of(failed->status) == kExitPeer && exit_code_of(w.status) != kExitPeer)) {
      failed = &w;
    }
  }
  return failed;
}

Agent::Outcome Agent::fail_round(const Worker& failed, const Round& round) {
  for (const Worker& w : workers_) {
    if (&w != &failed && w.exited && w.status != 0) {
      log::error("round {}: worker {}", round.index, worker_summary(w, round));
    }
  }
  record_failure(failed, round);
  kill_workers(SIGKILL);
  reap_all();
  return Outcome::kFailed;
}

void Agent::watch_heartbeats(int r) {
  const double now = seconds_since(round_start_);
  bool io_moved = false;
  for (Worker& w : workers_) {
    if (w.exited) continue;
    w.watch.read(try_read_file(w.heartbeat).bytes, now);
    io_moved = io_moved || w.watch.io_moved();
  }
  // The ranks that wait, outside their steps, for a peer moving the bytes (rank 0's verdict on the
  // run's last upload; a node's uploader) move none themselves.
  if (io_moved) {
    for (Worker& w : workers_) w.watch.peer_io(now);
  }
  for (Worker& w : workers_) {
    if (w.exited) continue;
    const std::string why = w.watch.verdict(now);
    if (!w.term_sent && !why.empty()) {
      log::error("round {}: rank {} (pid {}) {}: SIGTERM", r, w.rank, w.pid, why);
      kill(w.pid, SIGTERM);
      w.term_sent = true;
      w.hung = true;
      w.hung_why = why;
      w.term_at = Clock::now();
    } else if (w.term_sent && seconds_since(w.term_at) > o_.kill_grace_s) {
      log::error("round {}: rank {} (pid {}) still there {:.0f} s after SIGTERM: SIGKILL", r, w.rank, w.pid,
                 o_.kill_grace_s);
      kill(w.pid, SIGKILL);
      w.term_at = Clock::now() + std::chrono::hours(24);  // once
    }
  }
}

std::optional<Agent::Outcome> Agent::outcome_when_exited(int r) {
  bool all_exited = true, all_ok = true;
  for (const Worker& w : workers_) {
    all_exited = all_exited && w.exited;
    all_ok = all_ok && w.exited && w.status == 0;
  }
  if (forwarded_stop_ && all_exited) {
    if (!all_ok) log::warn("stopped, but not every worker exited 0 (see above)");
    return Outcome::kStopped;
  }
  if (!all_ok) return std::nullopt;
  // A hung worker that got going again on SIGTERM stops the whole job at a checkpoint: that is a
  // failure to restart from, not the end of training.
  for (const Worker& w : workers_) {
    if (!w.hung) continue;
    record_cause(r, kExitPeer, fmt::format("rank {} {} and was stopped by the watchdog", w.rank, w.hung_why), false);
    return Outcome::kFailed;
  }
  return counter(r, "rejoin") > 0 ? Outcome::kRejoin : Outcome::kDone;
}

std::optional<Agent::Outcome> Agent::follow_the_job(const Round& round) {
  const int r = round.index;
  if (counter(r, "failed") > 0 || !all_agents_alive(round)) {
    log::warn("round {}: another node failed; stopping this node's workers", r);
    kill_workers(SIGKILL);
    reap_all();
    return Outcome::kFailed;
  }
  if (!forwarded_stop_ && StopSignals::received() != 0) {
    log::warn("stop requested (signal {}): the workers checkpoint and exit", StopSignals::received());
    kill_workers(SIGTERM);
    forwarded_stop_ = true;
  }
  if (!forwarded_stop_ && round.nodes < o_.max_nodes && counter(r, "late") > 0 && counter(r, "rejoin") == 0) {
    // A node arrived after the round closed: every node checkpoints and all rejoin with it.
    store_->add(key(r, "rejoin"), 1);
  }
  if (!forwarded_stop_ && counter(r, "rejoin") > 0 && !workers_.empty() && !workers_[0].term_sent) {
    log::info("round {}: a new node is waiting; checkpointing to take it in", r);
    for (Worker& w : workers_) {
      if (!w.exited) kill(w.pid, SIGTERM);
      w.term_sent = true;
      w.term_at = Clock::now() + std::chrono::hours(24);  // a planned stop, not a hang
    }
  }
  return std::nullopt;
}

bool Agent::join_open_round(int* r, Round* round) {
  while (!join(*r, round)) {
    if (StopSignals::received() != 0) return false;
    if (round_over(*r)) {  // a relaunch after a stop, a finish or a give-up
      log::info("round {} is over (its agents ended or are gone): a new generation starts in round {}", *r, *r + 1);
      ++*r;
      continue;
    }
    log::info("round {} closed with {} nodes before this agent joined; waiting for the next round", *r, round->nodes);
    store_->add(key(*r, "late"), 1);
    while (!store_->check({key(*r + 1, "joined")})) {
      if (StopSignals::received() != 0) return false;
      const bool over = round_over(*r);  // waits up to a few ticks; returns at the next beat of a live round
      if (counter(*r, "done") > 0) {
        log::info("the job finished without this node");
        return false;
      }
      if (over) break;  // stopped or died while this node waited: start it again
    }
    ++*r;
  }
  return true;
}

int Agent::run() {
  const StopSignals stop;  // before any thread: workers and the store run alongside
  // The agents of one job (same token and run id, on any node) share the run directory's lock.
  const RunLock lock(o_.run_dir, comm::auth::job_namespace(o_.job_token) + "." + o_.run_id);
  store_ = comm::make_store(o_.rdzv, o_.job_token, "launch." + o_.run_id,
                            comm::Millis(static_cast<int64_t>(o_.rdzv_timeout_s * 1000)));
  heartbeat_dir_ = make_heartbeat_dir();
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{heartbeat_dir_};
  // Validated (at the smallest world size) and the dataset prepared once here, before any
  // rendezvous or worker; each round validates again at its own world size.
  // (A parallel.nproc the user sets comes after, so a bad one is still rejected here.)
  config::Overrides at_min = {{"parallel.nproc", std::to_string(o_.min_nodes * o_.nproc_per_node)}};
  at_min.insert(at_min.end(), o_.overrides.begin(), o_.overrides.end());
  const config::Config base = config::load(o_.config_path, at_min);
  data::resolve_dataset(base.data.synthetic, base.data.dataset, base.data.cache_dir, base.model.vocab_size);

  int r = 0;
  if (store_->check({"current"})) {
    const comm::Bytes b = store_->get("current", comm::Millis(1000));
    r = stored_count(b, "current");
  }
  int restarts = 0, first_code = 0;
  std::string first_failure;
  for (;;) {
    Round round;
    if (!join_open_round(&r, &round)) return kExitOk;
    log::info("round {}: node {} of {}, {} worker(s) per node, world size {}, restart {}/{}", r, round.node_rank,
              round.nodes, o_.nproc_per_node, round.nodes * o_.nproc_per_node, restarts, o_.max_restarts);
    announce(round);
    alive_seen_ = 0;
    start_workers(round, restarts);
    const Outcome outcome = monitor(round);
    if (outcome == Outcome::kDone) {
      store_->add(key(r, "done"), 1);
      log::info("done: this node's workers exited 0");
      return end_round(r, kExitOk);
    }
    if (outcome == Outcome::kStopped) {
      // Not finished: 128 + the signal, as a process ended by it, so that a scheduler replaces
      // this node (Kubernetes counts an exit 0 as a completed index) and the job resumes.
      log::info("stopped by signal {}: the workers checkpointed; resume by launching again", StopSignals::received());
      return end_round(r, o_.stopped_exit_code >= 0 ? o_.stopped_exit_code : 128 + StopSignals::received());
    }
    if (outcome == Outcome::kFailed) {
      const auto [code, summary] = read_failure(r);
      if (first_failure.empty()) first_failure = summary, first_code = code;
      if (!restartable(code)) {
        log::error("not restarting: exit code {} (configuration, data or health check) fails the same way again; {}",
                   code, summary);
        return end_round(r, code);
      }
      if (restarts == o_.max_restarts) {
        log::error("giving up: {} restart(s) used (--max-restarts {}); first failure: {}; last: {}", restarts,
                   o_.max_restarts, first_failure, summary);
        return end_round(r, first_code != 0 ? first_code : kExitFailure);
      }
      ++restarts;
      log::warn("round {} failed ({}); restarting every worker from the latest checkpoint, restart {}/{}", r, summary,
                restarts, o_.max_restarts);
    }
    ++r;  // kFailed or kRejoin: every agent moves to the next round
  }
}

}  // namespace

int run_agent(const LaunchOptions& options) { return Agent(options).run(); }

int run_local_job(const config::Config& config, const std::string& run_dir, const std::string& resume) {
  LaunchOptions o;
  o.nproc_per_node = static_cast<int>(config.parallel.nproc);
  o.run_dir = run_dir;
  o.rdzv = "file://" + run_dir + "/rendezvous";
  o.run_id = "train";
  o.job_token = comm::auth::new_job_token();
  o.max_restarts = 0;
  o.monitor_interval_s = 0.2;
  o.config_path = run_dir + "/config.toml";
  o.resume = resume.empty() ? "none" : resume;
  o.stopped_exit_code = kExitOk;
  // Held through run_agent (which shares it: same job), so a second run here is refused before
  // it touches the store or the config.
  const RunLock lock(run_dir, comm::auth::job_namespace(o.job_token) + "." + o.run_id);
  if (resume.empty()) checkpoint::refuse_fresh_run_over_checkpoints(run_dir, config.checkpoint.mirror_dir);
  std::error_code ec;
  fs::remove_all(run_dir + "/rendezvous", ec);  // a crashed run's store, under another token
  fs::create_directories(run_dir, ec);
  if (ec) throw IoError(fmt::format("cannot create run directory {}: {}", run_dir, ec.message()));
  write_file_atomic(o.config_path, config::to_toml(config));
  const int rc = run_agent(o);
  fs::remove_all(run_dir + "/rendezvous", ec);
  return rc;
}

}  // namespace tessera::launch
