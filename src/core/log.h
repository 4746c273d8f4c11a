// Leveled logging: to stderr, and to a per-process log file when one is opened; lines carry a
// rank prefix once the rank is set. A progress line (one line on a terminal, redrawn in place)
// stays below the log lines.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace tessera::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// The least severe level logged at all.
void set_level(Level level);
Level level();
// Stderr shows only lines at least this severe (and at least level()); the file gets level().
void set_console_level(Level level);
// Parses "debug", "info", "warn", "error"; returns false on anything else.
bool parse_level(std::string_view name, Level* out);
const char* level_name(Level level);  // the name parse_level reads
// Prefix every line with "[rank R] ", or "[rank R WHERE] " (e.g. where = "pp1 tp0 dp1", a rank's
// coordinates in a 3D layout), on stderr and in the log file; negative disables the prefix.
void set_rank(int rank, std::string_view where = {});
// Also append every line logged to `path`, with a UTC time stamp and the rank prefix, "[rank 0]"
// without one (flushed per line). Returns false, and warns, when the file cannot be opened. An
// empty path closes it.
bool open_file(const std::string& path);
// Draws `line` as the progress line on stdout (a terminal), replacing the previous one; later
// log lines go above it. An empty line ends it (the cursor moves to the next line).
void progress(std::string_view line);
// Whether a progress line is shown now.
bool progress_active();
// `console`: false sends the line to the log file only.
void write(Level level, std::string_view message, bool console = true);

template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kDebug) write(Level::kDebug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kInfo) write(Level::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
// An info line the progress line stands for on a terminal: there it goes to the log file only.
template <typename... Args>
void detail(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kInfo) write(Level::kInfo, fmt::format(f, std::forward<Args>(args)...), !progress_active());
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kWarn) write(Level::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kError, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tessera::log
