// Entry point of the `tessera` binary.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>

#include "cli/commands.h"

int main(int argc, char** argv) {
  // GNU OpenMP reads OMP_WAIT_POLICY once, when it is loaded. Its default (spin) turns every
  // parallel region into a wait for a scheduler time slice when another process holds a core
  // (a tiny step: 3 ms -> 720 ms); passive costs < 1% on a quiet machine. So unless the user
  // chose a policy, choose passive and start again with it in the environment.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && setenv("OMP_WAIT_POLICY", "passive", 1) == 0) {
    execv("/proc/self/exe", argv);  // returns only on failure: then run with the default policy
  }
  // A write to a connection whose peer died must fail with EPIPE (a collective error naming the
  // operation and rank, exit 12), not kill the process with SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  return tessera::cli::run(argc, argv);
}
