// fsync_and_drop_cache: after it, none of the file's pages is in the page cache (so a read-back
// verification reads the device), on file systems that cache separately from their storage.
// try_read_file and read_file: whole files of every size, files without a size (/proc), and what
// a missing file or a directory gives.
#include "core/file_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace tessera {
namespace {

// Pages of `path` resident in the page cache (mincore on a shared read-only mapping).
size_t resident_pages(const std::string& path, size_t bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  EXPECT_NE(map, MAP_FAILED);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_core((bytes + page - 1) / page);
  EXPECT_EQ(::mincore(map, bytes, in_core.data()), 0);
  ::munmap(map, bytes);
  size_t n = 0;
  for (unsigned char c : in_core) n += c & 1;
  return n;
}

TEST(FileIo, FsyncAndDropCacheLeavesNoPageCached) {
  char tmpl[] = "/tmp/tessera-file-io.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, path = dir + "/copy.bin";
  struct statfs fs_info {};
  ASSERT_EQ(::statfs(dir.c_str(), &fs_info), 0);
  if (fs_info.f_type == TMPFS_MAGIC) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "/tmp is a tmpfs: its pages are its storage";
  }
  const size_t bytes = 4 << 20;
  {
    std::ofstream out(path, std::ios::binary);
    const std::string block(bytes, 'x');
    out.write(block.data(), static_cast<std::streamsize>(bytes));
  }
  ASSERT_GT(resident_pages(path, bytes), 0u) << "a file just written is in the page cache";
  fsync_and_drop_cache(path);
  EXPECT_EQ(resident_pages(path, bytes), 0u);
  std::filesystem::remove_all(dir);
}

TEST(FileIo, FsyncAndDropCacheNamesAMissingFile) {
  try {
    fsync_and_drop_cache("/tmp/tessera-no-such-dir/file.bin");
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/tmp/tessera-no-such-dir/file.bin"), std::string::npos) << e.what();
  }
}

// Bytes 0..255 repeated: a NUL in the middle must not end the read.
std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 7 % 256);
  return s;
}

TEST(FileIo, ReadsWholeFilesOfEverySize) {
  char tmpl[] = "/tmp/tessera-file-io.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/f.bin";
  // Around the first buffer (4096), around a size hint's extra byte, and many doublings.
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{8192}, size_t{3 << 20}}) {
    const std::string bytes = pattern(n);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    const FileBytes f = try_read_file(path);
    ASSERT_TRUE(f) << n << ": " << f.reason();
    EXPECT_EQ(f.bytes.size(), n);
    EXPECT_TRUE(f.bytes == bytes) << n;
    EXPECT_TRUE(read_file(path) == bytes) << n;
  }
  std::filesystem::remove_all(tmpl);
}

TEST(FileIo, ReadsFilesWithoutASize) {
  // /proc files report size 0 and are read to their end; the kernel writes this one whole.
  const std::string status = read_file("/proc/self/status");
  EXPECT_GT(status.size(), 100u);
  EXPECT_NE(status.find("\nPid:\t"), std::string::npos) << status;
  EXPECT_EQ(status.back(), '\n');

  // A FIFO has no size either, and delivers its bytes in pieces: 1 MiB takes many buffer doublings.
  char tmpl[] = "/tmp/tessera-file-io.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string fifo = std::string(tmpl) + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string bytes = pattern(1 << 20);
  std::thread writer([&] { std::ofstream(fifo, std::ios::binary) << bytes; });
  const std::string got = read_file(fifo);
  writer.join();
  EXPECT_EQ(got.size(), bytes.size());
  EXPECT_TRUE(got == bytes);
  std::filesystem::remove_all(tmpl);
}

TEST(FileIo, ALimitRefusesWhatIsLongerAndReadsNoFurther) {
  char tmpl[] = "/tmp/tessera-file-io.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/f.bin";
  const std::string bytes = pattern(10000);
  std::ofstream(path, std::ios::binary) << bytes;
  for (size_t limit : {size_t{10000}, size_t{10001}, size_t{1} << 30}) {  // at, above, far above
    const FileBytes f = try_read_file(path, limit);
    ASSERT_TRUE(f) << limit << ": " << f.reason();
    EXPECT_TRUE(f.bytes == bytes) << limit;
  }
  for (size_t limit : {size_t{0}, size_t{1}, size_t{4095}, size_t{9999}}) {  // below: the size says so
    const FileBytes f = try_read_file(path, limit);
    EXPECT_EQ(f.error, EFBIG) << limit;
    EXPECT_TRUE(f.bytes.empty()) << limit;
  }

  // Without a size to go by: a FIFO stops being read one byte past the limit.
  const std::string fifo = std::string(tmpl) + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string long_stream = pattern(1 << 20);
  void (*const old_handler)(int) = std::signal(SIGPIPE, SIG_IGN);                     // the writer outlives the reader
  std::thread writer([&] { std::ofstream(fifo, std::ios::binary) << long_stream; });  // EPIPE ends it
  const FileBytes f = try_read_file(fifo, 5000);
  writer.join();
  std::signal(SIGPIPE, old_handler);
  EXPECT_EQ(f.error, EFBIG);
  EXPECT_EQ(f.bytes.size(), 5001u);
  EXPECT_EQ(f.bytes, long_stream.substr(0, 5001));
  std::filesystem::remove_all(tmpl);
}

TEST(FileIo, TryReadFileSaysWhyItFailed) {
  const FileBytes missing = try_read_file("/tmp/tessera-no-such-dir/file.bin");
  EXPECT_FALSE(missing);
  EXPECT_EQ(missing.error, ENOENT);
  EXPECT_EQ(missing.reason(), std::strerror(ENOENT));
  const FileBytes dir = try_read_file("/tmp");
  EXPECT_FALSE(dir);
  EXPECT_EQ(dir.error, EISDIR);
  EXPECT_TRUE(dir.bytes.empty());
}

TEST(FileIo, ReadFileNamesTheFileAndTheReason) {
  try {
    read_file("/tmp/tessera-no-such-dir/file.bin");
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(e.exit_code(), kExitIo);
    EXPECT_EQ(std::string(e.what()),
              std::string("cannot read /tmp/tessera-no-such-dir/file.bin: ") + std::strerror(ENOENT));
  }
}

}  // namespace
}  // namespace tessera
