// Raw text inputs: reading plain and zstd files, UTF-8 validation, cutting into documents.
#include "data/text.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/file_io.h"

namespace tessera::data {
namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Reads up to n bytes; fewer only at end of file.
size_t read_some(int fd, char* p, size_t n, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::read(fd, p + done, n - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw DataError(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return done;
}

std::string read_plain(int fd, const std::string& path) {
  std::string out;
  if (const int err = read_to_end(fd, out))
    throw DataError(fmt::format("cannot read {}: {}", path, std::strerror(err)));
  return out;
}

std::string read_zstd(int fd, const std::string& path) {
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> ctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  if (!ctx) throw std::bad_alloc();
  std::vector<char> in(ZSTD_DStreamInSize());
  std::string out;
  size_t have = 0, last = 0;
  bool any_input = false;
  for (;;) {
    const size_t n = read_some(fd, in.data(), in.size(), path);
    if (n == 0) break;
    if (!any_input) {
      // The frame's declared size is trusted for the first allocation up to 64 MiB only; beyond
      // that the buffer doubles as data actually arrives, so a lying header costs little.
      const unsigned long long declared = ZSTD_getFrameContentSize(in.data(), n);
      if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != ZSTD_CONTENTSIZE_ERROR) {
        out.resize(static_cast<size_t>(std::min<unsigned long long>(declared, 64ull << 20)) + 1);
      }
      any_input = true;
    }
    ZSTD_inBuffer ib{in.data(), n, 0};
    while (ib.pos < ib.size) {
      if (have == out.size()) out.resize(std::max<size_t>(out.size() * 2, 1 << 16));
      ZSTD_outBuffer ob{out.data() + have, out.size() - have, 0};
      last = ZSTD_decompressStream(ctx.get(), &ob, &ib);
      if (ZSTD_isError(last)) {
        throw DataError(fmt::format("{}: not valid zstd: {}", path, ZSTD_getErrorName(last)));
      }
      have += ob.pos;
    }
  }
  // Flush what the decoder still holds once input ends (the last block may not fit `out`).
  while (any_input && last != 0) {
    if (have == out.size()) out.resize(std::max<size_t>(out.size() * 2, 1 << 16));
    ZSTD_inBuffer ib{nullptr, 0, 0};
    ZSTD_outBuffer ob{out.data() + have, out.size() - have, 0};
    const size_t before = have;
    last = ZSTD_decompressStream(ctx.get(), &ob, &ib);
    if (ZSTD_isError(last)) throw DataError(fmt::format("{}: not valid zstd: {}", path, ZSTD_getErrorName(last)));
    have += ob.pos;
    if (last != 0 && have == before && have < out.size()) {
      throw DataError(fmt::format("{}: not valid zstd: truncated frame", path));
    }
  }
  out.resize(have);
  return out;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }

bool is_blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return is_space(c); });
}

// End of the line that starts at `pos` (index of its '\n', or text.size()).
size_t line_end(std::string_view text, size_t pos) {
  const size_t nl = text.find('\n', pos);
  return nl == std::string_view::npos ? text.size() : nl;
}

// The end of the run of ASCII bytes from text[i], 8 bytes at a time where it can.
size_t valid_ascii_prefix(std::string_view text, size_t i) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  while (i + 8 <= text.size()) {
    uint64_t w;
    std::memcpy(&w, s + i, 8);
    if ((w & 0x8080808080808080ull) != 0) break;
    i += 8;
  }
  while (i < text.size() && s[i] < 0x80) ++i;
  return i;
}

// The length of the valid UTF-8 sequence at text[i], or 0 when none starts there; then `*bad` is
// the length of its maximal subpart (the bytes one U+FFFD replaces). Overlong forms, surrogates
// and code points above U+10FFFF are invalid.
size_t utf8_sequence(std::string_view text, size_t i, size_t* bad) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  *bad = 1;
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < n; ++k) {
    const unsigned char b = i + k < text.size() ? byte(i + k) : 0;
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) {
      *bad = k;
      return 0;
    }
  }
  return n;
}

}  // namespace

std::string read_text_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw DataError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw DataError(fmt::format("cannot stat {}: {}", path, std::strerror(errno)));
  if (S_ISDIR(st.st_mode)) throw DataError(fmt::format("{} is a directory, not a text file", path));
  const bool zst = path.size() >= 4 && path.compare(path.size() - 4, 4, ".zst") == 0;
  std::string text = zst ? read_zstd(fd.get(), path) : read_plain(fd.get(), path);
  if (is_blank(text)) throw DataError(fmt::format("{} is empty", path));
  if (const int64_t bad = find_invalid_utf8(text); bad >= 0) {
    throw DataError(fmt::format("{}: invalid UTF-8 at byte {}", path, bad));
  }
  return text;
}

int64_t find_invalid_utf8(std::string_view text) {
  for (size_t i = valid_ascii_prefix(text, 0); i < text.size(); i = valid_ascii_prefix(text, i)) {
    size_t bad;
    const size_t n = utf8_sequence(text, i, &bad);
    if (n == 0) return static_cast<int64_t>(i);
    i += n;
  }
  return -1;
}

std::string replace_invalid_utf8(std::string_view text) {
  const int64_t first = find_invalid_utf8(text);
  if (first < 0) return std::string(text);
  std::string out(text.substr(0, static_cast<size_t>(first)));
  out.reserve(text.size() + 8);
  for (size_t i = static_cast<size_t>(first); i < text.size();) {
    const size_t ascii = valid_ascii_prefix(text, i);
    out.append(text.substr(i, ascii - i));
    if ((i = ascii) == text.size()) break;
    size_t bad;
    if (const size_t n = utf8_sequence(text, i, &bad); n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += bad;
    }
  }
  return out;
}

std::vector<std::string_view> split_documents(std::string_view text) {
  std::vector<std::string_view> docs;
  size_t begin = std::string_view::npos, end = 0;  // current document: [begin, end)
  for (size_t pos = 0; pos < text.size();) {
    const size_t e = line_end(text, pos);
    if (is_blank(text.substr(pos, e - pos))) {
      if (begin != std::string_view::npos) docs.push_back(text.substr(begin, end - begin));
      begin = std::string_view::npos;
    } else {
      if (begin == std::string_view::npos) begin = pos;
      end = e;
    }
    pos = e + 1;
  }
  if (begin != std::string_view::npos) docs.push_back(text.substr(begin, end - begin));
  return docs;
}

std::vector<size_t> split_at_documents(std::string_view text, int parts) {
  std::vector<size_t> cuts = {0};
  // A cut at or before the first document would leave a piece of blank lines only.
  size_t first_doc = 0;
  while (first_doc < text.size()) {
    const size_t e = line_end(text, first_doc);
    if (!is_blank(text.substr(first_doc, e - first_doc))) break;
    first_doc = e + 1;
  }
  for (int p = 1; p < parts; ++p) {
    const size_t target = text.size() * static_cast<size_t>(p) / static_cast<size_t>(parts);
    size_t pos = std::min(std::max({target, cuts.back(), first_doc + 1}), text.size());
    // Start at the next line start, then find a non-blank line that follows a blank one: cutting
    // there leaves every document whole on one side.
    if (pos > 0 && text[pos - 1] != '\n') pos = std::min(line_end(text, pos) + 1, text.size());
    bool after_blank = pos > 0 && pos < text.size() && [&] {
      // Is the line before `pos` blank? It ends at pos - 1 and starts after the previous '\n'.
      const size_t prev_start = pos >= 2 ? text.rfind('\n', pos - 2) : std::string_view::npos;
      const size_t s = prev_start == std::string_view::npos ? 0 : prev_start + 1;
      return is_blank(text.substr(s, pos - 1 - s));
    }();
    size_t cut = text.size();
    while (pos < text.size()) {
      const size_t e = line_end(text, pos);
      const bool blank = is_blank(text.substr(pos, e - pos));
      if (!blank && after_blank) {
        cut = pos;
        break;
      }
      after_blank = blank;
      pos = e + 1;
    }
    if (cut > cuts.back() && cut > first_doc && cut < text.size()) cuts.push_back(cut);
  }
  cuts.push_back(text.size());
  return cuts;
}

}  // namespace tessera::data
