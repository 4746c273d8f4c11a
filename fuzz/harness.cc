// Scratch files, findings and the seed-writing mode shared by the parser fuzz targets.
#include "harness.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <typeinfo>

#include "core/file_io.h"

namespace tessera::fuzz {
namespace {

std::string make_scratch_dir() {
  std::string base;
  if (const char* b = std::getenv("TESSERA_FUZZ_TMPDIR"); b != nullptr && *b != '\0') {
    base = b;
  } else if (std::filesystem::is_directory("/dev/shm")) {
    base = "/dev/shm";  // tmpfs: a write per input costs no disk
  } else if (const char* t = std::getenv("TMPDIR"); t != nullptr && *t != '\0') {
    base = t;
  } else {
    base = "/tmp";
  }
  std::string templ = base + "/tessera-fuzz-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr)
    finding("cannot create a scratch directory in " + base + ": " + std::strerror(errno));
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(scratch_dir(), ec);
  });
  return templ;
}

}  // namespace

const std::string& scratch_dir() {
  // Never destroyed: the exit handler that removes the directory runs after static destructors.
  static const std::string* dir = new std::string(make_scratch_dir());
  return *dir;
}

std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) finding("cannot create " + path + ": " + std::strerror(errno));
  write_all(fd, data, size, path);  // an IoError here escapes as a finding: the harness is broken
  ::close(fd);
  return path;
}

void finding(const std::string& what) {
  std::fprintf(stderr, "\n==FINDING== %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

void unexpected_exception(const std::exception* e) {
  finding(e == nullptr ? std::string("an exception that is not a std::exception escaped the parser")
                       : std::string("exception ") + typeid(*e).name() +
                             " escaped the parser (only tessera::Error may): " + e->what());
}

}  // namespace tessera::fuzz

// libFuzzer calls this before parsing its flags; --write-seeds=DIR is ours, not libFuzzer's.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  constexpr std::string_view kFlag = "--write-seeds=";
  for (int i = 1; i < *argc; ++i) {
    const std::string_view arg = (*argv)[i];
    if (arg.substr(0, kFlag.size()) != kFlag) continue;
    const std::string dir(arg.substr(kFlag.size()));
    std::filesystem::create_directories(dir);
    try {
      tessera::fuzz::write_seeds(dir);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cannot write seeds to %s: %s\n", dir.c_str(), e.what());
      std::exit(1);
    }
    std::exit(0);
  }
  return 0;
}
