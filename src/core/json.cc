// The one instantiation of nlohmann::json's parser and serializer (core/json.h).
#include "core/json.h"

namespace tessera {

nlohmann::json parse_json(std::string_view text) {
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

nlohmann::json parse_json_or_throw(std::string_view text) { return nlohmann::json::parse(text); }

nlohmann::ordered_json parse_ordered_json_or_throw(std::string_view text) {
  return nlohmann::ordered_json::parse(text);
}

namespace {
template <typename Json>
std::string dump(const Json& j, int indent, bool replace_invalid_utf8) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false,
                replace_invalid_utf8 ? Json::error_handler_t::replace : Json::error_handler_t::strict);
}
}  // namespace

std::string dump_json(const nlohmann::json& j, int indent, bool replace_invalid_utf8) {
  return dump(j, indent, replace_invalid_utf8);
}

std::string dump_json(const nlohmann::ordered_json& j, int indent, bool replace_invalid_utf8) {
  return dump(j, indent, replace_invalid_utf8);
}

}  // namespace tessera
