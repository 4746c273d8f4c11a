// Text inputs: UTF-8 validation, document splitting, cutting at document boundaries, and reading
// plain and zstd files with the failures named.
#include "data/text.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

class TextFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           fmt::format("tessera_text_{}_{}", ::testing::UnitTest::GetInstance()->current_test_info()->name(), getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  std::string error_of(const std::string& path) {
    try {
      read_text_file(path);
    } catch (const DataError& e) {
      return e.what();
    }
    return "(no error)";
  }
  fs::path dir_;
};

std::string zstd_compress(const std::string& s, int level = 3) {
  std::string out(ZSTD_compressBound(s.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), s.data(), s.size(), level);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

// Compressed without the content size in the frame header, in small chunks.
std::string zstd_stream_compress(const std::string& s) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 0);
  std::string out;
  std::vector<char> buf(ZSTD_CStreamOutSize());
  for (size_t pos = 0; pos <= s.size(); pos += 1000) {
    const bool last = pos + 1000 >= s.size();
    ZSTD_inBuffer in{s.data() + pos, std::min<size_t>(1000, s.size() - pos), 0};
    size_t left;
    do {
      ZSTD_outBuffer o{buf.data(), buf.size(), 0};
      left = ZSTD_compressStream2(c, &o, &in, last ? ZSTD_e_end : ZSTD_e_continue);
      EXPECT_FALSE(ZSTD_isError(left));
      out.append(buf.data(), o.pos);
    } while (last ? left != 0 : in.pos < in.size);
    if (last) break;
  }
  ZSTD_freeCCtx(c);
  return out;
}

TEST(Text, Utf8ValidationFindsTheFirstBadByte) {
  EXPECT_EQ(find_invalid_utf8(""), -1);
  EXPECT_EQ(find_invalid_utf8("plain ascii, long enough for the fast path"), -1);
  EXPECT_EQ(find_invalid_utf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF"), -1);  // é € 😀 U+10FFFF
  const std::string prefix = "0123456789abcdef";  // 16 ASCII bytes: the bad byte is past the fast path
  struct Case {
    std::string bad;
    const char* why;
  };
  const Case cases[] = {
      {"\x80", "lone continuation byte"},
      {"\xC0\x80", "overlong NUL"},
      {"\xC1\xBF", "overlong 2-byte"},
      {"\xE0\x80\x80", "overlong 3-byte"},
      {"\xED\xA0\x80", "UTF-16 surrogate"},
      {"\xF0\x80\x80\x80", "overlong 4-byte"},
      {"\xF4\x90\x80\x80", "above U+10FFFF"},
      {"\xF5\x80\x80\x80", "invalid lead byte"},
      {"\xFF", "invalid byte"},
      {"\xC3", "truncated at the end"},
      {"\xE2\x82", "truncated 3-byte"},
      {"\xE2\x28\xA1", "bad continuation"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(find_invalid_utf8(c.bad), 0) << c.why;
    EXPECT_EQ(find_invalid_utf8(prefix + c.bad + "tail"), 16) << c.why;
    EXPECT_EQ(find_invalid_utf8("\xC3\xA9" + c.bad), 2) << c.why;
  }
}

TEST(Text, InvalidUtf8IsReplacedOncePerMaximalSubpart) {
  constexpr const char* R = "\xEF\xBF\xBD";  // U+FFFD
  const std::string valid = "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 and plain ASCII past the fast path";
  EXPECT_EQ(replace_invalid_utf8(""), "");
  EXPECT_EQ(replace_invalid_utf8(valid), valid);
  // Unicode's table of maximal subparts (and Rust's String::from_utf8_lossy): a truncated but
  // well-begun sequence is one U+FFFD; a byte that cannot begin or continue one is one each.
  const std::pair<std::string, std::string> cases[] = {
      {"\x80", R},
      {"\xC0\x80", std::string(R) + R},
      {"\xE0\x80\x80", std::string(R) + R + R},
      {"\xED\xA0\x80", std::string(R) + R + R},
      {"\xF0\x80\x80\x80", std::string(R) + R + R + R},
      {"\xF4\x90\x80\x80", std::string(R) + R + R + R},
      {"\xFF", R},
      {"\xC3", R},
      {"\xE2\x82", R},
      {"\xF0\x9F\x98", R},
      {"\xE2\x28\xA1", std::string(R) + "(" + R},
      {"\xF0\x9F\x98\xE2\x82\xAC", std::string(R) + "\xE2\x82\xAC"},
  };
  for (const auto& [bad, want] : cases) {
    EXPECT_EQ(replace_invalid_utf8(bad), want) << "for " << ::testing::PrintToString(bad);
    EXPECT_EQ(replace_invalid_utf8(valid + bad + valid), valid + want + valid) << ::testing::PrintToString(bad);
  }
}

TEST(Text, DocumentsAreSeparatedByBlankLines) {
  const std::string text =
      "\n  \n"
      "first line\nsecond line\n"
      "\n"
      "  indented doc\r\n"
      " \t \r\n"
      "\n"
      "third\n"
      "last without newline";
  const auto docs = split_documents(text);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "first line\nsecond line");
  EXPECT_EQ(docs[1], "  indented doc\r");
  EXPECT_EQ(docs[2], "third\nlast without newline");
  EXPECT_TRUE(split_documents("").empty());
  EXPECT_TRUE(split_documents("\n \n\t\n").empty());
  EXPECT_EQ(split_documents("one").size(), 1u);
}

TEST(Text, CutsFallOnDocumentBoundaries) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    const int lines = static_cast<int>(rng() % 40);
    for (int l = 0; l < lines; ++l) {
      switch (rng() % 4) {
        case 0:
          text += "\n";
          break;
        case 1:
          text += " \t\n";
          break;
        default:
          text += std::string(1 + rng() % 30, static_cast<char>('a' + rng() % 26)) + "\n";
      }
    }
    if (rng() % 2) text += "tail";
    const auto whole = split_documents(text);
    for (int parts = 1; parts <= 6; ++parts) {
      const auto cuts = split_at_documents(text, parts);
      ASSERT_GE(cuts.size(), 2u);
      ASSERT_LE(cuts.size(), static_cast<size_t>(parts) + 1);
      EXPECT_EQ(cuts.front(), 0u);
      EXPECT_EQ(cuts.back(), text.size());
      std::vector<std::string_view> joined;
      for (size_t p = 0; p + 1 < cuts.size(); ++p) {
        ASSERT_LT(cuts[p], cuts[p + 1] + (text.empty() ? 1 : 0));
        const std::string_view piece = std::string_view(text).substr(cuts[p], cuts[p + 1] - cuts[p]);
        const auto docs = split_documents(piece);
        if (!whole.empty()) {
          EXPECT_FALSE(docs.empty()) << "piece " << p << " of " << parts << " holds no document";
        }
        joined.insert(joined.end(), docs.begin(), docs.end());
      }
      ASSERT_EQ(joined.size(), whole.size()) << "parts " << parts;
      for (size_t d = 0; d < whole.size(); ++d) EXPECT_EQ(joined[d].data(), whole[d].data());
    }
  }
  // Large even text: every piece is within a document of the even share.
  std::string big;
  for (int d = 0; d < 1000; ++d) big += "a document line\nanother\n\n";
  const auto cuts = split_at_documents(big, 4);
  ASSERT_EQ(cuts.size(), 5u);
  for (size_t p = 0; p + 1 < cuts.size(); ++p) EXPECT_NEAR(cuts[p + 1] - cuts[p], big.size() / 4.0, 30.0);
}

TEST_F(TextFiles, ReadsPlainAndZstd) {
  std::string text;
  for (int i = 0; i < 5000; ++i) text += fmt::format("line {} caf\xC3\xA9\n{}", i, i % 7 == 0 ? "\n" : "");
  EXPECT_EQ(read_text_file(write("a.txt", text)), text);
  EXPECT_EQ(read_text_file(write("a.txt.zst", zstd_compress(text))), text);
  EXPECT_EQ(read_text_file(write("s.txt.zst", zstd_stream_compress(text))), text);
  // Concatenated frames decode to the concatenation.
  EXPECT_EQ(read_text_file(write("two.txt.zst", zstd_compress(text) + zstd_compress("more\n"))), text + "more\n");
}

TEST_F(TextFiles, FailuresNameTheFile) {
  const std::string missing = (dir_ / "missing.txt").string();
  EXPECT_NE(error_of(missing).find(missing), std::string::npos);
  const std::string empty = write("empty.txt", "");
  EXPECT_NE(error_of(empty).find(empty + " is empty"), std::string::npos);
  const std::string blank = write("blank.txt", " \n\n\t\n");
  EXPECT_NE(error_of(blank).find(blank + " is empty"), std::string::npos);
  const std::string empty_zst = write("empty.txt.zst", "");
  EXPECT_NE(error_of(empty_zst).find("is empty"), std::string::npos);
  const std::string bad = write("bad.txt", "good line\nbad \xC3\x28 byte\n");
  EXPECT_NE(error_of(bad).find(bad + ": invalid UTF-8 at byte 14"), std::string::npos) << error_of(bad);
  const std::string bad_zst = write("bad.txt.zst", zstd_compress("ok\n\xFF\n"));
  EXPECT_NE(error_of(bad_zst).find(bad_zst + ": invalid UTF-8 at byte 3"), std::string::npos);
  const std::string garbage = write("garbage.zst", "this is not zstd at all");
  EXPECT_NE(error_of(garbage).find(garbage + ": not valid zstd"), std::string::npos) << error_of(garbage);
  std::mt19937 rng(1);
  std::string text;
  for (int i = 0; i < 100000; ++i) text += static_cast<char>('a' + rng() % 26);
  std::string z = zstd_compress(text, 1);
  z.resize(z.size() / 2);
  const std::string truncated = write("trunc.txt.zst", z);
  EXPECT_NE(error_of(truncated).find(truncated + ": not valid zstd"), std::string::npos) << error_of(truncated);
  EXPECT_NE(error_of(dir_.string()).find("is a directory"), std::string::npos);
}

}  // namespace
}  // namespace tessera::data
