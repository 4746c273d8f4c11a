// Small command-line parser: flags with values, repeated --set, and positional arguments.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"

namespace tessera::cli {

struct ParsedArgs {
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;  // "--steps" -> "12"
  config::Overrides overrides;               // from --set k=v, in order
  // List flags' values: "--input" -> {"a.txt", "b.txt"}.
  std::map<std::string, std::vector<std::string>> lists;
  bool help = false;

  // The flag's value or `fallback`; an integer flag that does not parse is a ConfigError.
  std::string get(const std::string& flag, const std::string& fallback) const;
  long long get_int(const std::string& flag, long long fallback) const;
  double get_double(const std::string& flag, double fallback) const;
  // The values of a list flag, in order (empty when absent).
  std::vector<std::string> get_list(const std::string& flag) const;
};

// `value_flags` take a value ("--steps 12" or "--steps=12"); `list_flags` take every following
// argument up to the next one starting with "--" ("--input a b c"; repeating the flag appends);
// `switch_flags` take none (flags[name] = "1"); anything else starting with "--" is an error
// naming the flag (ConfigError, exit code 2).
ParsedArgs parse_args(const std::vector<std::string>& args, const std::vector<std::string>& value_flags,
                      const std::vector<std::string>& list_flags = {},
                      const std::vector<std::string>& switch_flags = {});

// Token ids given on the command line ("1 2 3" or "1,2,3"), each in [0, vocab); a ConfigError
// naming `flag` otherwise.
std::vector<int32_t> parse_token_ids(const std::string& text, int64_t vocab, const std::string& flag);

// The configuration: the one CONFIG file among the positional arguments (or the defaults) with the
// --set overrides, validated; sets the log level it names.
config::Config load_config(const ParsedArgs& a);

}  // namespace tessera::cli
