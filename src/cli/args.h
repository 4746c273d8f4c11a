// Small command-line parser: flags with values, repeated --set, and positional arguments.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "config/config.h"

namespace tessera::cli {

struct ParsedArgs {
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;  // "--steps" -> "12"
  config::Overrides overrides;               // from --set k=v, in order
  bool help = false;

  // The flag's value or `fallback`; an integer flag that does not parse is a ConfigError.
  std::string get(const std::string& flag, const std::string& fallback) const;
  long long get_int(const std::string& flag, long long fallback) const;
};

// `value_flags` take a value ("--steps 12" or "--steps=12"); anything else starting with "--" is
// an error naming the flag (ConfigError, exit code 2).
ParsedArgs parse_args(const std::vector<std::string>& args, const std::vector<std::string>& value_flags);

}  // namespace tessera::cli
