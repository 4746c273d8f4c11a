// `tessera checkpoint verify|reshard`: offline tools over sharded checkpoints.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

#include "checkpoint/directory.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "train/checkpointer.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kCheckpointUsage = R"(usage: tessera checkpoint <command>
  verify DIR      check sizes and checksums of a checkpoint (a step directory, or a checkpoint
                  root / run directory: every committed checkpoint in it); names the bad file
                  and tensor; exit 3 when anything is damaged
  reshard SRC DST --nproc N [--set parallel.strategy=S] [--set parallel.shard_group_size=G]
                  write checkpoint SRC (a step directory or a root with `latest`) re-cut for N
                  ranks into the checkpoint root DST
)";

// The step directories DIR names: itself when it holds a manifest, else every committed one in
// DIR or DIR/checkpoints.
std::vector<std::string> step_dirs(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "manifest.json", ec)) return {dir};
  for (const fs::path& root : {fs::path(dir), fs::path(dir) / "checkpoints"}) {
    std::vector<std::string> out;
    for (const int64_t step : checkpoint::committed_steps(root.string())) {
      out.push_back((root / checkpoint::step_dir_name(step)).string());
    }
    if (!out.empty()) return out;
  }
  throw DataError(fmt::format("{}: no committed checkpoint (no manifest.json) there", dir));
}

int cmd_verify(const Args& args) {
  const ParsedArgs a = parse_args(args, {});
  if (a.help || a.positional.size() != 1) {
    std::fputs(kCheckpointUsage, a.help ? stdout : stderr);
    return a.help ? kExitOk : kExitConfig;
  }
  int bad = 0;
  for (const std::string& dir : step_dirs(a.positional[0])) {
    const std::vector<std::string> problems = checkpoint::verify(dir);
    if (problems.empty()) {
      const checkpoint::Manifest m = checkpoint::read_manifest(dir);
      fmt::print("ok      {} (step {}, {} file(s), world {}, {})\n", dir, m.step, m.files.size(), m.world, m.strategy);
    } else {
      ++bad;
      fmt::print("DAMAGED {}\n", dir);
      for (const auto& p : problems) fmt::print("  {}\n", p);
    }
  }
  return bad == 0 ? kExitOk : kExitData;
}

int cmd_reshard(const Args& args) {
  const ParsedArgs a = parse_args(args, {"--nproc"});
  if (a.help || a.positional.size() != 2 || !a.flags.count("--nproc")) {
    std::fputs(kCheckpointUsage, a.help ? stdout : stderr);
    return a.help ? kExitOk : kExitConfig;
  }
  const std::vector<std::string> dirs = step_dirs(a.positional[0]);
  std::string src = dirs.back();
  for (const fs::path& root : {fs::path(a.positional[0]), fs::path(a.positional[0]) / "checkpoints"}) {
    if (const int64_t latest = checkpoint::read_latest(root.string()); latest >= 0) {
      src = (root / checkpoint::step_dir_name(latest)).string();
      break;
    }
  }
  config::Overrides o = {{"parallel.nproc", a.get("--nproc", "1")}};
  o.insert(o.end(), a.overrides.begin(), a.overrides.end());
  for (const auto& [key, value] : o) {
    if (!key.starts_with("parallel.")) {
      throw ConfigError(fmt::format("--set {}={}: reshard changes parallel.* keys only", key, value));
    }
  }
  // The checkpoint's own config with the new parallel settings, validated as a whole.
  const config::Config target = config::load_text(checkpoint::read_manifest(src).config_toml, src, o);
  const std::string out = train::reshard(src, a.positional[1], target);
  fmt::print("wrote {} ({} rank(s), {}) from {}\n", out, target.parallel.nproc, target.parallel.strategy, src);
  return kExitOk;
}

}  // namespace

int cmd_checkpoint(const Args& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kCheckpointUsage, args.empty() ? stderr : stdout);
    return args.empty() ? kExitConfig : kExitOk;
  }
  const Args rest(args.begin() + 1, args.end());
  if (args[0] == "verify") return cmd_verify(rest);
  if (args[0] == "reshard") return cmd_reshard(rest);
  fmt::print(stderr, "tessera checkpoint: unknown command '{}'\n\n{}", args[0], kCheckpointUsage);
  return kExitConfig;
}

}  // namespace tessera::cli
