// Fuzzes the TCP store's request parser (comm/tcp_store_frame.h), the first code a stranger on
// the store port reaches: the input is a byte stream parsed frame by frame as the server does,
// before authentication (fields capped at kMaxHelloBlob) and after (kMaxBlob). Every parsed frame
// re-encodes to exactly the bytes it came from, a frame never claims bytes beyond the input, and
// the stream parses to the same frames when it arrives in two pieces at any split.
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "comm/tcp_store_frame.h"
#include "harness.h"

namespace tessera::fuzz {

void write_seeds(const std::string& dir) {
  using namespace comm::tcp;
  const std::string nonce(32, 'n'), proof(32, 'p');
  const std::string_view p = proof, v = "12";
  std::ofstream(dir + "/hello_then_add.bin", std::ios::binary)
      << encode_frame(kHello, nonce, &p) << encode_frame(kAdd, "r0/counter", &v);
  std::ofstream(dir + "/partial.bin", std::ios::binary) << encode_frame(kSet, "r0/key", &v).substr(0, 9);
}

namespace {

// The frames a stream parses to (and whether it ended in a bad frame), fed in pieces at `split`.
std::vector<std::string> frames(std::string_view stream, size_t max_blob, size_t split, bool* bad) {
  std::vector<std::string> out;
  std::string buffer;
  *bad = false;
  for (std::string_view piece : {stream.substr(0, split), stream.substr(split)}) {
    buffer.append(piece);
    for (;;) {
      comm::tcp::Request r;
      size_t used = 0;
      const auto result = comm::tcp::parse_request(buffer, max_blob, &r, &used);
      if (result == comm::tcp::Parse::kBad) {
        *bad = true;
        return out;
      }
      if (result == comm::tcp::Parse::kNeedMore) break;
      FUZZ_CHECK(used <= buffer.size() && r.key.size() <= max_blob && r.value.size() <= max_blob);
      const std::string_view value = r.value;
      const std::string again = comm::tcp::encode_frame(r.op, r.key, &value);
      FUZZ_CHECK(again.size() == used && buffer.compare(0, used, again) == 0);
      out.push_back(again);
      buffer.erase(0, used);
    }
  }
  return out;
}

}  // namespace
}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string_view stream(reinterpret_cast<const char*>(data), size);
  for (const size_t cap : {comm::tcp::kMaxHelloBlob, comm::tcp::kMaxBlob}) {
    bool bad_whole = false, bad_split = false;
    const auto whole = fuzz::frames(stream, cap, size, &bad_whole);
    const auto split = fuzz::frames(stream, cap, size / 3, &bad_split);
    FUZZ_CHECK(whole == split && bad_whole == bad_split);
  }
  return 0;
}
