// Layer cli: the `tessera` subcommands, the only layer that sees them all.
//
// The `tessera` subcommands. Each returns a process exit code; faults arrive as tessera::Error.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace tessera::cli {

using Args = std::vector<std::string>;

int cmd_info(const Args& args);
int cmd_train(const Args& args);
int cmd_bench(const Args& args);
int cmd_config(const Args& args);
// Data commands (cli/data_commands.cc).
int cmd_tokenizer(const Args& args);  // tessera tokenizer train ...
int cmd_prepare(const Args& args);
// Commands over a trained model (cli/model_commands.cc).
int cmd_generate(const Args& args);
int cmd_eval(const Args& args);
// Saved weights (cli/checkpoint_commands.cc): tessera checkpoint export|import|verify|reshard ...
int cmd_checkpoint(const Args& args);

// The run's metrics as an HTML page (cli/report_command.cc).
int cmd_report(const Args& args);

// Memory and speed before running (cli/plan_command.cc): tessera plan, and train --dry-run's
// plan of a config on this machine.
int cmd_plan(const Args& args);
int dry_run(const config::Config& config);

// The per-node agent (cli/launch_command.cc).
int cmd_launch(const Args& args);

// Dispatches argv[1]; prints usage on no or unknown command.
int run(int argc, char** argv);

}  // namespace tessera::cli
