// Rendezvous URLs (etcd://HOST:PORT/PREFIX, file://DIR) and the store each names.
#include "comm/store.h"

#include <fmt/format.h>

#include <string>

#include "comm/process_group.h"
#include "comm/store_impl.h"
#include "core/error.h"

namespace tessera::comm {

int64_t read_counter(Store& store, const std::string& key) {
  if (!store.check({key})) return 0;
  // The key is there: the timeout only bounds a slow store's reply.
  const std::string text = string_of(store.get(key, Millis(10000)));
  int64_t value = 0;
  if (!detail::parse_counter(text, &value)) {
    throw StoreError(fmt::format("the store's key '{}' holds \"{}\", not a count", key, text.substr(0, 32)));
  }
  return value;
}

StoreUrl parse_store_url(const std::string& url) {
  auto bad = [&](const std::string& why) {
    return ConfigError("rendezvous URL '" + url + "': " + why +
                       " (use etcd://HOST:PORT/PREFIX, file://DIR or tcp://HOST:PORT)");
  };
  StoreUrl out;
  if (url.rfind("file://", 0) == 0) {
    out.kind = StoreUrl::Kind::kFile;
    out.dir = url.substr(7);
    if (out.dir.empty()) throw bad("no directory");
    return out;
  }
  if (url.rfind("tcp://", 0) == 0) {
    out.kind = StoreUrl::Kind::kTcp;
    out.endpoint = url.substr(6);
    const size_t colon = out.endpoint.rfind(':');
    const std::string port = colon == std::string::npos ? "" : out.endpoint.substr(colon + 1);
    const bool digits = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
    if (colon == 0 || colon == std::string::npos || !digits || std::stoi(port) < 1 || std::stoi(port) > 65535) {
      throw bad("expected tcp://HOST:PORT");
    }
    return out;
  }
  if (url.rfind("etcd://", 0) != 0) throw bad("unknown scheme");
  out.kind = StoreUrl::Kind::kEtcd;
  std::string rest = url.substr(7);
  size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  if (slash == std::string::npos || rest.find_first_not_of('/', slash) == std::string::npos) throw bad("no prefix");
  out.prefix = detail::clean_store_prefix(rest.substr(slash));
  if (out.prefix.empty()) throw bad("bad prefix '" + rest.substr(slash) + "' (NAME[/NAME...] of [A-Za-z0-9_.-])");
  // HOST:PORT, or [IPv6]:PORT.
  size_t colon = authority.rfind(':');
  if (colon == std::string::npos) throw bad("no port");
  std::string host = authority.substr(0, colon), port = authority.substr(colon + 1);
  bool bracketed = host.size() >= 2 && host.front() == '[' && host.back() == ']';
  if (host.empty() || (!bracketed && host.find_first_of("[]:") != std::string::npos))
    throw bad("bad host '" + host + "'");
  if (host.find_first_of("@?# ") != std::string::npos) throw bad("bad host '" + host + "'");
  bool digits = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || std::stoi(port) < 1 || std::stoi(port) > 65535) throw bad("bad port '" + port + "'");
  out.endpoint = authority;
  return out;
}

std::unique_ptr<Store> make_store(const std::string& url, const std::string& job_token, const std::string& round,
                                  Millis timeout) {
  StoreUrl u = parse_store_url(url);
  if (u.kind == StoreUrl::Kind::kFile) return make_file_store(u.dir, job_token, round);
  if (u.kind == StoreUrl::Kind::kTcp) return make_tcp_store(u.endpoint, job_token, round, timeout);
  return make_etcd_store(u.endpoint, u.prefix, job_token, round, timeout);
}

}  // namespace tessera::comm
