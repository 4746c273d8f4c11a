// The heartbeat file's layout: see heartbeat.h.
#include "core/heartbeat.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <string_view>

#include "core/text.h"

namespace tessera::heartbeat {
namespace {

constexpr std::string_view kFinishing = " finishing";

// The whole of `text` as a number, else nullopt.
template <typename T>
std::optional<T> number(std::string_view text) {
  T v{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || text.empty() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace

Beat parse(const std::string& text) {
  Beat b;
  const size_t eol = text.find('\n');
  b.step = trim(std::string_view(text).substr(0, eol));
  b.finishing = b.step.size() > kFinishing.size() && b.step.ends_with(kFinishing);
  if (b.finishing) b.step.resize(b.step.size() - kFinishing.size());
  // Then "KEY VALUE" lines, each padded with spaces and whole only with its newline.
  for (size_t at = eol; at != std::string::npos && at + 1 < text.size();) {
    const size_t end = text.find('\n', at + 1);
    if (end == std::string::npos) break;  // caught half-written
    const std::string_view line = std::string_view(text).substr(at + 1, end - at - 1);
    at = end;
    const size_t space = line.find(' ');
    if (space == std::string_view::npos) continue;
    const std::string_view key = line.substr(0, space), value = trim(line.substr(space));
    if (key == "io") {
      b.io_bytes = number<uint64_t>(value);
    } else if (key == "gpu_util") {
      const std::optional<double> v = number<double>(value);
      if (v && std::isfinite(*v) && *v >= 0) b.gpu_util_pct = v;
    }
  }
  return b;
}

std::string step_line(int64_t step, bool finishing) {
  return fmt::format("{:<{}}\n", finishing ? fmt::format("{}{}", step, kFinishing) : fmt::to_string(step),
                     kStepColumns);
}

std::string pulse_lines(uint64_t io_bytes, std::optional<double> gpu_util_pct) {
  std::string text = fmt::format("io {:<20}\n", io_bytes);
  if (gpu_util_pct) text += fmt::format("gpu_util {:<8.1f}\n", *gpu_util_pct);
  return text;
}

}  // namespace tessera::heartbeat
