// The `tessera` subcommands. Each returns a process exit code; faults arrive as tessera::Error.
#pragma once

#include <string>
#include <vector>

namespace tessera::cli {

using Args = std::vector<std::string>;

int cmd_info(const Args& args);
int cmd_train(const Args& args);
int cmd_bench(const Args& args);
int cmd_config(const Args& args);

// Dispatches argv[1]; prints usage on no or unknown command.
int run(int argc, char** argv);

}  // namespace tessera::cli
