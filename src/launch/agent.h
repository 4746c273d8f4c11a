// Layer launch: starting, watching and restarting worker processes. It must not know the trainer:
// the agent executes this binary's worker command, the local launcher a function it is given.
//
// `tessera launch`: one agent per node (ARCHITECTURE.md, "Launcher and resilience").
//
// Agents meet in rendezvous rounds in a store (file:// today; the key layout is the same for any
// Store): round r's agents take node ranks in the order they join, the first one closes the round
// once MIN nodes have joined and either MAX have or `last_call` has passed, and every agent
// starts nproc_per_node workers (`tessera train` processes with TESSERA_RANK, TESSERA_WORLD_SIZE,
// ... in their environment, resuming from the run's latest checkpoint). The agent then watches
// its workers (exit status, heartbeat), the round's failure flag and its own stop signals:
//   - a worker fails or hangs (no new step within hang_timeout, or within gpu_idle_timeout with
//     its GPU idle all that while, launch/progress.h: TERM, then KILL after a grace period): the
//     agent names it in the store, stops its other workers, and every agent moves
//     to round r + 1, restarting from the latest checkpoint, up to max_restarts;
//   - with etcd, each agent holds a leased key in the round: when an agent dies its key lapses
//     and the others restart into a new round (a replacement agent is taken in there);
//   - an agent joins after a round closed: the others restart into a round that includes it
//     (not counted as a failure), up to MAX nodes;
//   - SIGTERM or SIGINT to an agent: preemption; its workers get SIGTERM, every rank stops after
//     the same step, checkpoints and exits 0; the agent then exits 128 + the signal (the job is
//     not finished: a scheduler should start it again, and it resumes from that checkpoint).
// Beyond max_restarts the agent exits with the first failure's exit code and prints a summary
// (rank, signal or exit code, step, time). Exit codes 2 (configuration), 3 (data) and 4 (health
// check) are never restarted: they would fail again.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace tessera::launch {

struct LaunchOptions {
  int min_nodes = 1, max_nodes = 1;  // --nnodes MIN[:MAX]
  int nproc_per_node = 1;
  std::string rdzv;                  // file://DIR
  std::string run_id;                // names the job in the store
  std::string job_token;             // TESSERA_JOB_TOKEN
  int max_restarts = 3;
  double monitor_interval_s = 1.0;
  double hang_timeout_s = 1800;      // no new step for this long: the worker is hung
  double gpu_idle_timeout_s = 600;   // or this long, after a first step, with its GPU at 0% (0: off)
  double kill_grace_s = 10;          // between TERM and KILL
  double rdzv_timeout_s = 600;       // for MIN nodes to join
  double last_call_s = 2;            // after MIN nodes joined, how long to wait for more
  double agent_ttl_s = 10;           // etcd: an agent whose lease lapses this long is gone
  std::string host = "127.0.0.1";    // this node's address for the workers' connections
  std::string run_dir;
  std::string config_path;           // passed on to the workers, with the overrides
  config::Overrides overrides;
  std::string resume = "auto";       // the workers' --resume: auto, none (a fresh run) or a path
  int stopped_exit_code = -1;        // when stopped by a signal: -1 for 128 + the signal
};

// Runs the agent to the end of the job; returns the process exit code.
int run_agent(const LaunchOptions& options);

// `tessera train --nproc N`: the single-node case, N workers through a file store in
// RUN/rendezvous under a fresh job token, no automatic restart; a stop by SIGTERM or SIGINT
// (workers checkpointed) returns 0. `config` is written to RUN/config.toml for the workers.
int run_local_job(const config::Config& config, const std::string& run_dir, const std::string& resume);

}  // namespace tessera::launch
