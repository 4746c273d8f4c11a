// fsync_and_drop_cache: after it, none of the file's pages is in the page cache (so a read-back
// verification reads the device), on file systems that cache separately from their storage.
#include "core/file_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
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

}  // namespace
}  // namespace tessera
