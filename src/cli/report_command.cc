// `tessera report RUN_DIR`: the run's metrics as one self-contained HTML page (metrics/report.h).
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "metrics/report.h"

namespace tessera::cli {

int cmd_report(const Args& args) {
  const ParsedArgs a = parse_args(args, {"--out"});
  constexpr const char* kUsage =
      "usage: tessera report RUN_DIR [--out FILE]\n"
      "  writes an HTML page (default RUN_DIR/report.html) with the run's metadata, a summary and plots of\n"
      "  loss, throughput, MFU, step time split, memory and per-rank compute time; it needs no network\n";
  if (a.help) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (a.positional.size() != 1 || !a.overrides.empty()) {
    throw ConfigError(fmt::format("tessera report takes one RUN_DIR and no --set\n{}", kUsage));
  }
  const std::string run_dir = a.positional[0];
  const std::string out = a.get("--out", (std::filesystem::path(run_dir) / "report.html").string());
  metrics::write_report(run_dir, out);
  log::info("wrote {}", out);
  return kExitOk;
}

}  // namespace tessera::cli
