// JSON text in and out (nlohmann::json), in one place: its parser and serializer are the heaviest
// templates this code base instantiates (about 10 s of compile time in each file that parses,
// under the sanitizers), so every file calls these rather than json::parse and dump.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace tessera {

// `text` parsed, or a discarded value (is_discarded()) where it is not JSON (a number out of
// range, like 1e999, included).
nlohmann::json parse_json(std::string_view text);
// `text` parsed, or nlohmann::json::exception: parse_error (with the byte it stopped at), or
// out_of_range for a number out of range.
nlohmann::json parse_json_or_throw(std::string_view text);
nlohmann::ordered_json parse_ordered_json_or_throw(std::string_view text);

// j as text: one line, or `indent` spaces a level. A string that is not UTF-8 throws
// nlohmann::json::type_error, unless replace_invalid_utf8 (U+FFFD for each bad byte).
std::string dump_json(const nlohmann::json& j, int indent = -1, bool replace_invalid_utf8 = false);
std::string dump_json(const nlohmann::ordered_json& j, int indent = -1, bool replace_invalid_utf8 = false);

}  // namespace tessera
