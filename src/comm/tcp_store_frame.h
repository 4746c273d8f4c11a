// The TCP store's wire format, shared by its server, its client and the frame parser's fuzzer.
//
// Both ways little-endian. A request is u8 op, u32 key length, key, u32 value length, value; a
// reply is u8 status, u32 length, data. A connection starts with the server's challenge (a
// reply: kOk and a fresh nonce); the client answers with kHello (key: its own nonce, value:
// auth::proof(token, "client", ...)); the server replies kOk with its own proof, or kRefused and
// closes. Before that, frames longer than kMaxHelloBlob per field are refused unread.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tessera::comm::tcp {

enum Op : uint8_t { kHello = 1, kSet, kGet, kAdd, kCheck, kList };
enum Status : uint8_t { kOk = 0, kMissing, kRefused, kNotInteger };

inline constexpr size_t kMaxBlob = 64u << 20;  // a key or value of an authenticated client
inline constexpr size_t kMaxHelloBlob = 64;    // any field before authentication

struct Request {
  uint8_t op = 0;
  std::string key, value;
};

enum class Parse { kNeedMore, kDone, kBad };

// Parses the request at the front of `buf` without reading past it. kDone: *out holds it and
// *consumed its length; kBad: an unknown op or a field longer than `max_blob` (the caller closes
// the connection; nothing was allocated for the field); kNeedMore: `buf` is a proper prefix.
inline Parse parse_request(std::string_view buf, size_t max_blob, Request* out, size_t* consumed) {
  if (buf.empty()) return Parse::kNeedMore;
  const auto op = static_cast<uint8_t>(buf[0]);
  if (op < kHello || op > kList) return Parse::kBad;
  size_t at = 1;
  std::string_view fields[2];
  for (std::string_view& field : fields) {
    if (buf.size() < at + 4) return Parse::kNeedMore;
    uint32_t n = 0;
    std::memcpy(&n, buf.data() + at, 4);
    if (n > max_blob) return Parse::kBad;
    at += 4;
    if (buf.size() < at + n) return Parse::kNeedMore;
    field = buf.substr(at, n);
    at += n;
  }
  out->op = op;
  out->key.assign(fields[0]);
  out->value.assign(fields[1]);
  *consumed = at;
  return Parse::kDone;
}

// head, u32 |a|, a, and when b is given u32 |b|, b: a reply (head = status, no b) or a request.
inline std::string encode_frame(uint8_t head, std::string_view a, const std::string_view* b = nullptr) {
  std::string frame(1, static_cast<char>(head));
  const auto append = [&](std::string_view s) {
    const auto n = static_cast<uint32_t>(s.size());
    frame.append(reinterpret_cast<const char*>(&n), 4);
    frame.append(s);
  };
  append(a);
  if (b != nullptr) append(*b);
  return frame;
}

}  // namespace tessera::comm::tcp
