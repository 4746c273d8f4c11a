// `tessera launch`: the per-node agent (src/launch/agent.h).
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "comm/store.h"
#include "config/config.h"
#include "core/error.h"
#include "launch/agent.h"

namespace tessera::cli {

namespace {

constexpr const char* kLaunchUsage =
    "usage: tessera launch --nnodes MIN[:MAX] --nproc-per-node N --rdzv URL --run-id ID\n"
    "                      [--max-restarts R] [--monitor-interval S] [--hang-timeout S] [--gpu-idle-timeout S]\n"
    "                      [--kill-grace S] [--rdzv-timeout S] [--last-call S] [--host ADDR] [--run-dir DIR]\n"
    "                      [CONFIG] [--set key=value]...\n"
    "  one agent per node; every agent of a job has the same --rdzv (file://DIR on a shared file system,\n"
    "  or etcd://HOST:PORT/PREFIX), --run-id and TESSERA_JOB_TOKEN (environment).\n"
    "  Workers train CONFIG into --run-dir (default runs/ID; on a file system all\n"
    "  nodes see), resuming from its latest checkpoint after a failure, up to R restarts (default 3).\n"
    "  --hang-timeout: seconds without a new step (before the first and after the last: without bytes\n"
    "  moved through checkpoints or the object store either, by the worker or by the uploads and loads\n"
    "  it awaits on any node) before a worker gets SIGTERM (default 1800), then SIGKILL after\n"
    "  --kill-grace seconds (default 10). --gpu-idle-timeout: the same after this many seconds without\n"
    "  a new step once the worker has made one, if its GPU showed 0% utilization all that while,\n"
    "  unless its steps are done (default 600; 0: off; CPU workers report no utilization).\n"
    "  --host: this node's address for the workers' connections (default 127.0.0.1).\n"
    "  SIGTERM or SIGINT: the workers checkpoint and exit 0; the agent exits 128 + the signal (143 or\n"
    "  130: not finished, launch again to resume). Exit 0: training finished.\n";

constexpr const char* kNameChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-";

// 1 to max_length characters, each one of `allowed`.
bool all_of_chars(const std::string& text, const char* allowed, size_t max_length) {
  return !text.empty() && text.size() <= max_length && text.find_first_not_of(allowed) == std::string::npos;
}

}  // namespace

int cmd_launch(const Args& args) {
  const ParsedArgs a = parse_args(args, {"--nnodes", "--nproc-per-node", "--rdzv", "--run-id", "--max-restarts",
                                         "--monitor-interval", "--hang-timeout", "--gpu-idle-timeout", "--rdzv-timeout",
                                         "--host", "--run-dir", "--last-call", "--kill-grace"});
  if (a.help) {
    std::fputs(kLaunchUsage, stdout);
    return kExitOk;
  }
  for (const char* required : {"--nnodes", "--nproc-per-node", "--rdzv", "--run-id"}) {
    if (!a.flags.count(required)) throw ConfigError(fmt::format("missing {}\n{}", required, kLaunchUsage));
  }
  if (a.positional.size() > 1) throw ConfigError(fmt::format("expected at most one CONFIG\n{}", kLaunchUsage));
  launch::LaunchOptions o;
  const std::string nnodes = a.get("--nnodes", "");
  const size_t colon = nnodes.find(':');
  const std::string min_text = nnodes.substr(0, colon), max_text = colon == std::string::npos ? min_text : nnodes.substr(colon + 1);
  if (!all_of_chars(min_text, "0123456789", 6) || !all_of_chars(max_text, "0123456789", 6)) {
    throw ConfigError(fmt::format("--nnodes {}: expected MIN or MIN:MAX", nnodes));
  }
  o.min_nodes = std::stoi(min_text);
  o.max_nodes = std::stoi(max_text);
  if (o.min_nodes < 1 || o.max_nodes < o.min_nodes) {
    throw ConfigError(fmt::format("--nnodes {}: need 1 <= MIN <= MAX", nnodes));
  }
  o.nproc_per_node = static_cast<int>(a.get_int("--nproc-per-node", 1));
  if (o.nproc_per_node < 1 || o.nproc_per_node > 1024) {
    throw ConfigError(fmt::format("--nproc-per-node {}: expected 1 to 1024", o.nproc_per_node));
  }
  o.rdzv = a.get("--rdzv", "");
  if (comm::parse_store_url(o.rdzv).kind == comm::StoreUrl::Kind::kTcp) {
    throw ConfigError(fmt::format("--rdzv {}: a tcp:// store is served by rank 0 of torchrun-style workers; agents "
                                  "meet through file://DIR or etcd://HOST:PORT/PREFIX",
                                  o.rdzv));
  }
  o.run_id = a.get("--run-id", "");
  if (!all_of_chars(o.run_id, kNameChars, 64) || o.run_id.find('.') != std::string::npos) {
    throw ConfigError(fmt::format("--run-id \"{}\": use 1 to 64 of [A-Za-z0-9_-]", o.run_id));
  }
  const char* token = std::getenv("TESSERA_JOB_TOKEN");
  if (token == nullptr || *token == '\0') {
    throw ConfigError("TESSERA_JOB_TOKEN is not set: every agent and worker of a job needs the job's secret token "
                      "(e.g. export TESSERA_JOB_TOKEN=$(head -c 18 /dev/urandom | base64 | tr '+/' '-_'))");
  }
  o.job_token = token;
  if (!all_of_chars(o.job_token, kNameChars, 128)) {
    throw ConfigError("TESSERA_JOB_TOKEN: use 1 to 128 of [A-Za-z0-9_.-]");
  }
  o.max_restarts = static_cast<int>(a.get_int("--max-restarts", 3));
  if (o.max_restarts < 0) throw ConfigError(fmt::format("--max-restarts {}: expected >= 0", o.max_restarts));
  // Seconds; zero_means: what 0 does, where 0 is allowed.
  auto seconds = [&](const char* flag, double fallback, const char* zero_means = nullptr) {
    const double v = a.get_double(flag, fallback);
    if (v < 0 || (v == 0 && zero_means == nullptr)) {
      throw ConfigError(fmt::format("{} {}: expected seconds {}", flag, a.get(flag, ""),
                                    zero_means != nullptr ? fmt::format(">= 0 (0: {})", zero_means) : "> 0"));
    }
    return v;
  };
  o.monitor_interval_s = seconds("--monitor-interval", 1.0);
  o.hang_timeout_s = seconds("--hang-timeout", 1800);
  o.gpu_idle_timeout_s = seconds("--gpu-idle-timeout", 600, "off");
  o.rdzv_timeout_s = seconds("--rdzv-timeout", 600);
  o.last_call_s = seconds("--last-call", 2, "no wait for late nodes");
  o.kill_grace_s = seconds("--kill-grace", 10, "SIGKILL at once");
  o.host = a.get("--host", "127.0.0.1");
  o.run_dir = a.get("--run-dir", "runs/" + o.run_id);
  o.config_path = a.positional.empty() ? "" : a.positional[0];
  o.overrides = a.overrides;
  return launch::run_agent(o);
}

}  // namespace tessera::cli
