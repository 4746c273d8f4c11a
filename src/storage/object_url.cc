#include "storage/object_url.h"

#include <fmt/format.h>

#include "core/error.h"

namespace tessera::storage {

std::string ObjectUrl::str() const { return key.empty() ? "s3://" + bucket : "s3://" + bucket + "/" + key; }

ObjectUrl ObjectUrl::child(const std::string& name) const { return {bucket, key.empty() ? name : key + "/" + name}; }

std::string ObjectUrl::name() const {
  const size_t slash = key.rfind('/');
  return slash == std::string::npos ? key : key.substr(slash + 1);
}

bool is_s3(const std::string& location) { return location.rfind("s3://", 0) == 0; }

namespace {

// S3's rules: 3 to 63 characters, lower-case letters, digits, '.' and '-', starting and ending
// with a letter or digit.
bool valid_bucket(const std::string& b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-')) return false;
  }
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  return alnum(b.front()) && alnum(b.back());
}

}  // namespace

ObjectUrl parse_s3(const std::string& location, const std::string& what) {
  if (!is_s3(location)) throw ConfigError(fmt::format("{} = \"{}\" is not an s3:// URL", what, location));
  std::string rest = location.substr(5);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  ObjectUrl url;
  const size_t slash = rest.find('/');
  url.bucket = rest.substr(0, slash);
  if (slash != std::string::npos) url.key = rest.substr(slash + 1);
  if (!valid_bucket(url.bucket)) {
    throw ConfigError(
        fmt::format("{} = \"{}\": \"{}\" is not a bucket name (3 to 63 lower-case letters, digits, '.' or '-')", what,
                    location, url.bucket));
  }
  if (url.key.find("//") != std::string::npos || (!url.key.empty() && url.key.front() == '/')) {
    throw ConfigError(fmt::format("{} = \"{}\": the prefix has an empty path component", what, location));
  }
  for (char c : url.key) {
    if (static_cast<unsigned char>(c) < 0x20 || c == '\\') {
      throw ConfigError(fmt::format("{} = \"{}\": the prefix holds a control character or '\\'", what, location));
    }
  }
  return url;
}

void check_location(const std::string& location, const std::string& what) {
  if (is_s3(location)) {
    parse_s3(location, what);
    return;
  }
  const size_t colon = location.find("://");
  if (colon != std::string::npos) {
    throw ConfigError(
        fmt::format("{} = \"{}\": the scheme \"{}://\" is not supported (a local path or s3://BUCKET/PREFIX)", what,
                    location, location.substr(0, colon)));
  }
}

}  // namespace tessera::storage
