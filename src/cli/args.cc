// Small command-line parser.
#include "cli/args.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "core/log.h"

namespace tessera::cli {

std::string ParsedArgs::get(const std::string& flag, const std::string& fallback) const {
  auto it = flags.find(flag);
  return it == flags.end() ? fallback : it->second;
}

long long ParsedArgs::get_int(const std::string& flag, long long fallback) const {
  auto it = flags.find(flag);
  if (it == flags.end()) return fallback;
  long long v = 0;
  const std::string& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) {
    throw ConfigError(fmt::format("{} expects an integer, got \"{}\"", flag, s));
  }
  return v;
}

double ParsedArgs::get_double(const std::string& flag, double fallback) const {
  auto it = flags.find(flag);
  if (it == flags.end()) return fallback;
  double v = 0;
  const std::string& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) {
    throw ConfigError(fmt::format("{} expects a finite number, got \"{}\"", flag, s));
  }
  return v;
}

std::vector<std::string> ParsedArgs::get_list(const std::string& flag) const {
  auto it = lists.find(flag);
  return it == lists.end() ? std::vector<std::string>{} : it->second;
}

ParsedArgs parse_args(const std::vector<std::string>& args, const std::vector<std::string>& value_flags,
                      const std::vector<std::string>& list_flags, const std::vector<std::string>& switch_flags) {
  ParsedArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      out.help = true;
      continue;
    }
    if (!a.starts_with("--")) {
      out.positional.push_back(a);
      continue;
    }
    std::string name = a, value;
    bool has_value = false;
    if (const size_t eq = a.find('='); eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      has_value = true;
    }
    if (std::find(list_flags.begin(), list_flags.end(), name) != list_flags.end()) {
      std::vector<std::string>& values = out.lists[name];
      const size_t before = values.size();
      if (has_value) values.push_back(value);
      while (i + 1 < args.size() && !args[i + 1].starts_with("--")) values.push_back(args[++i]);
      if (values.size() == before) throw ConfigError(fmt::format("option {} needs at least one value", name));
      continue;
    }
    if (std::find(switch_flags.begin(), switch_flags.end(), name) != switch_flags.end()) {
      if (has_value) throw ConfigError(fmt::format("option {} takes no value", name));
      out.flags[name].assign(1, '1');  // (operator= of a literal trips GCC 12's -Wrestrict)
      continue;
    }
    const bool is_set = name == "--set";
    if (!is_set && std::find(value_flags.begin(), value_flags.end(), name) == value_flags.end()) {
      throw ConfigError(fmt::format("unknown option {}", name));
    }
    if (!has_value) {
      if (i + 1 >= args.size()) throw ConfigError(fmt::format("option {} needs a value", name));
      value = args[++i];
    }
    if (is_set) out.overrides.push_back(config::parse_override(value));
    else out.flags[name] = value;
  }
  return out;
}

config::Config load_config(const ParsedArgs& a) {
  if (a.positional.size() > 1)
    throw ConfigError(fmt::format("expected at most one CONFIG file, got {}", a.positional.size()));
  config::Config c = config::load(a.positional.empty() ? "" : a.positional[0], a.overrides);
  log::set_level(c.metrics.log_level);
  return c;
}

std::vector<int32_t> parse_token_ids(const std::string& text, int64_t vocab, const std::string& flag) {
  std::vector<int32_t> ids;
  std::string s = text;
  std::replace(s.begin(), s.end(), ',', ' ');
  std::istringstream in(s);
  for (long long id; in >> id;) {
    if (id < 0 || id >= vocab) {
      throw ConfigError(fmt::format("{}: token id {} is outside the vocabulary [0, {})", flag, id, vocab));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  if (!in.eof() || ids.empty()) throw ConfigError(fmt::format("{}: \"{}\" is not a list of token ids", flag, text));
  return ids;
}

}  // namespace tessera::cli
