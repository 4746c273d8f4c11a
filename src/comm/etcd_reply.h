// What the etcd store reads from its v3 JSON gateway's replies, apart from the network code, so
// that etcd_store.cc and the reply fuzzer (fuzz/etcd_reply_fuzz.cc) run the same parser.
//
// proto3 JSON omits zero values and empty strings and sends int64 as a string; keys and values are
// padded standard base64. A reply of an unexpected shape reads as absent fields, never as one of
// nlohmann's exceptions: the readers below throw only StoreError, naming `who` (the store). No
// message echoes a reply's structure (dump() recurses as deep as the reply nests).
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/json.h"

namespace tessera::comm::etcd {

using json = nlohmann::json;

// The gRPC status of an error reply that a retry may cure: no leader yet, or stopping.
inline constexpr int kGrpcUnavailable = 14;
// etcd's longest lease (lease.MaxLeaseTTL, seconds): its milliseconds fit in int64.
inline constexpr int64_t kMaxLeaseTtl = 9'000'000'000;

inline std::string base64_encode(const std::string& in) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(v >> s) & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

// Returns false on a character outside the alphabet (etcd only sends padded standard base64).
inline bool base64_decode(const std::string& in, std::string* out) {
  out->clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z')
      v = c - 'A';
    else if (c >= 'a' && c <= 'z')
      v = c - 'a' + 26;
    else if (c >= '0' && c <= '9')
      v = c - '0' + 52;
    else if (c == '+')
      v = 62;
    else if (c == '/')
      v = 63;
    else if (c == '=')
      break;
    else
      return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      *out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return true;
}

// The smallest key above every key with this prefix: etcd's range_end for a prefix scan.
inline std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<uint8_t>(prefix.back()) != 0xff) {
      prefix.back() = static_cast<char>(static_cast<uint8_t>(prefix.back()) + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // the whole key space
}

// Field readers: a missing field, or one of another JSON type, reads as null (or "", or 0).
inline const json& field(const json& j, const char* name) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(name);
  return it == j.end() ? kNull : *it;
}
inline const json& element(const json& j, size_t i) {
  static const json kNull;
  return j.is_array() && i < j.size() ? j[i] : kNull;
}
inline std::string string_field(const json& j, const char* name) {
  const json& f = field(j, name);
  return f.is_string() ? f.get<std::string>() : std::string();
}
// A string that is not an integer throws StoreError.
inline int64_t int_field(const json& j, const char* name) {
  const json& f = field(j, name);
  if (f.is_number_integer()) return f.get<int64_t>();
  int64_t v = 0;
  if (f.is_string()) {
    const std::string& text = f.get_ref<const std::string&>();
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size())
      throw StoreError(std::string("etcd store: reply field '") + name + "' is not an integer: " + text);
  }
  return v;
}
inline bool succeeded(const json& txn_reply) {
  const json& f = field(txn_reply, "succeeded");
  return f.is_boolean() && f.get<bool>();
}
// The first key-value of a range reply, or null when the key does not exist.
inline const json* first_kv(const json& range_reply) {
  const json& kv = element(field(range_reply, "kvs"), 0);
  return kv.is_object() ? &kv : nullptr;
}
// The range reply inside the i-th response of a transaction.
inline const json& txn_range(const json& txn_reply, size_t i) {
  return field(element(field(txn_reply, "responses"), i), "response_range");
}
// A base64 field, decoded; invalid base64 throws StoreError naming `who`.
inline std::string decoded_field(const json& j, const char* name, const std::string& who) {
  std::string out;
  if (!base64_decode(string_field(j, name), &out))
    throw StoreError("etcd store " + who + ": reply holds invalid base64");
  return out;
}

// The gateway's answer to one request.
struct Reply {
  bool ok = false;         // HTTP 200: `body` is the reply
  json body;               // the reply's JSON, whatever the status
  std::string failure;     // not ok: etcd's message (else the body's text) and the HTTP status
  bool transient = false;  // not ok: a retry may cure it (no leader yet, or stopping)
};

// An HTTP reply of the gateway; false when its body is not JSON. Throws StoreError when an error
// reply's code is a string that is not an integer.
inline bool read_reply(long status, const std::string& text, Reply* out) {
  *out = Reply();
  out->body = parse_json(text);
  if (out->body.is_discarded()) return false;
  if (status == 200) {
    out->ok = true;
    return true;
  }
  const int64_t code = int_field(out->body, "code");
  std::string message = string_field(out->body, "message");
  if (message.empty()) message = text;
  out->failure = message + " (HTTP " + std::to_string(status) + ")";
  out->transient = code == kGrpcUnavailable || status == 503;
  return true;
}

// get() and claim(): the value of a /v3/kv/range reply's key, or nullopt when it does not exist.
inline std::optional<std::string> range_value(const json& range_reply, const std::string& who) {
  const json* kv = first_kv(range_reply);
  if (kv == nullptr) return std::nullopt;
  return decoded_field(*kv, "value", who);
}

// add(): a /v3/kv/txn of one compare whose failure branch reads the key. When it did not succeed,
// `current` is the key as that read found it (nullopt: absent): its value and the revision of
// its last change.
struct Kv {
  std::string value;
  int64_t mod_revision = 0;
};
struct TxnOutcome {
  bool succeeded = false;
  std::optional<Kv> current;
};
inline TxnOutcome txn_outcome(const json& txn_reply, const std::string& who) {
  TxnOutcome out;
  out.succeeded = succeeded(txn_reply);
  if (out.succeeded) return out;
  if (const json* kv = first_kv(txn_range(txn_reply, 0))) {
    const int64_t mod_revision = int_field(*kv, "mod_revision");
    out.current = Kv{decoded_field(*kv, "value", who), mod_revision};
  }
  return out;
}

// absent(): a /v3/kv/txn of `n` count_only ranges with no compare: whether each key exists.
// Throws StoreError unless the transaction succeeded with exactly n responses.
inline std::vector<bool> txn_exists(const json& txn_reply, size_t n, const std::string& who) {
  const size_t responses = field(txn_reply, "responses").size();
  if (!succeeded(txn_reply) || responses != n)
    throw StoreError("etcd store " + who + ": a transaction of " + std::to_string(n) + " ranges answered " +
                     std::to_string(responses) + (responses == 1 ? " response" : " responses") +
                     (succeeded(txn_reply) ? "" : ", not succeeded"));
  std::vector<bool> exists(n);
  for (size_t i = 0; i < n; ++i) exists[i] = int_field(txn_range(txn_reply, i), "count") != 0;
  return exists;
}

// list(): a keys_only /v3/kv/range of the keys starting with `base`: those keys without `base`,
// sorted. A key outside `base` throws StoreError.
inline std::vector<std::string> range_keys(const json& range_reply, const std::string& base, const std::string& who) {
  std::vector<std::string> keys;
  const json& kvs = field(range_reply, "kvs");
  for (size_t i = 0; i < kvs.size(); ++i) {
    std::string key = decoded_field(element(kvs, i), "key", who);
    if (key.compare(0, base.size(), base) != 0)
      throw StoreError("etcd store " + who + ": a prefix scan answered the key '" + key + "'");
    keys.push_back(key.substr(base.size()));
  }
  std::sort(keys.begin(), keys.end());  // etcd sorts by key already; the contract should not depend on it
  return keys;
}

// grant_lease(): a /v3/lease/grant reply's lease: an ID, and a TTL in (0, kMaxLeaseTtl], else
// StoreError.
struct Grant {
  int64_t id = 0;
  int64_t ttl_s = 0;
};
inline Grant lease_grant(const json& reply, const std::string& who) {
  const Grant g{int_field(reply, "ID"), int_field(reply, "TTL")};
  if (g.id == 0 || g.ttl_s <= 0 || g.ttl_s > kMaxLeaseTtl)
    throw StoreError("etcd store " + who + ": lease grant answered ID " + std::to_string(g.id) + ", TTL " +
                     std::to_string(g.ttl_s) + " s (etcd grants an ID and a TTL of 1 to " +
                     std::to_string(kMaxLeaseTtl) + " s)");
  return g;
}

// The lease thread: the body of an HTTP 200 to /v3/lease/keepalive. 1: renewed; 0: a reply that
// says nothing (retry); -1: the lease is gone (an expired lease is answered with no TTL: proto3
// omits the zero).
inline int keepalive_result(const std::string& text) {
  const json reply = parse_json(text);
  if (reply.is_discarded() || !field(reply, "result").is_object()) return 0;
  try {
    return int_field(field(reply, "result"), "TTL") > 0 ? 1 : -1;
  } catch (const StoreError&) {
    return 0;
  }
}

}  // namespace tessera::comm::etcd
