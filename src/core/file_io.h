// Whole files read in one call, and written so that a crash never leaves a damaged one: every
// write completes or throws, and a file becomes visible under its name only once it is whole and
// on disk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera {

// A whole file's bytes, or why they could not be read.
struct FileBytes {
  std::string bytes;  // the whole file when error is 0; else what was read before the failure
  int error = 0;      // errno of the open or read that failed

  explicit operator bool() const { return error == 0; }
  std::string reason() const;  // strerror(error)
};

// Appends what `fd` holds from its offset to end of file to `out` (also when its size is not known
// ahead, such as a pipe's or /proc's); returns 0, or the errno of the read that failed, what was
// read before it staying in `out`. More than `max_bytes` fails with EFBIG: at once where the file's
// size says so, else having read at most one byte more than that.
int read_to_end(int fd, std::string& out, size_t max_bytes = SIZE_MAX);

// Reads the whole of `path` (also a file whose size is not known ahead, such as /proc's; a
// directory fails with EISDIR; a file of more than `max_bytes` with EFBIG). Never throws for a
// missing or unreadable file: the caller decides what that means (an optional file, or its own
// error naming what the file is for).
FileBytes try_read_file(const std::string& path, size_t max_bytes = SIZE_MAX);

// The whole of `path`; throws IoError naming it, with the reason, when it cannot be read.
std::string read_file(const std::string& path);

// Writes all n bytes to fd, retrying on EINTR and short writes. Throws IoError naming `path`.
void write_all(int fd, const void* data, size_t n, const std::string& path);

// fsyncs the file `path` (its data is on disk once this returns). Throws IoError naming it.
void fsync_path(const std::string& path);

// fsyncs `path`, then asks the kernel to drop its cached pages, so that the next read of it comes
// from the storage device: a verification that reads a copy back checks what is on disk, not the
// memory it was written from. Throws IoError naming the file when the fsync fails; the drop is
// advice (a file system without a separate cache, such as tmpfs, keeps its pages).
void fsync_and_drop_cache(const std::string& path);

// fsyncs the directory that holds `path`, so that a rename into it is durable. Throws IoError
// naming the directory when that fails: a lost rename must not pass for a durable one.
void sync_parent_dir(const std::string& path);

// Writes `bytes` to `path` through "<path>.tmp": write, fsync, rename, fsync the directory.
// Never writes through a symlink (at `path` the rename replaces the link itself; the temporary
// is created afresh with O_EXCL | O_NOFOLLOW). Throws IoError naming the file; leaves no
// temporary file behind on failure.
void write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace tessera
