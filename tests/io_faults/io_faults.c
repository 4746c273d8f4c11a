// An LD_PRELOAD library that makes file system calls fail on chosen paths, as a flaky NFS or
// FUSE mount does (EIO, ESTALE, EACCES), for tests/adversarial_test.sh. Configured by:
//   TESSERA_IO_FAULT_PATH   calls on a path containing this text fail (unset: the library is
//                           inert); a final '$' means "ending with" (a directory, not its files)
//   TESSERA_IO_FAULT_OPS    which calls, comma-separated: stat, open, read, fsync (default: all)
//   TESSERA_IO_FAULT_ERRNO  the error: EIO (default), ESTALE, EACCES, ENOSPC, ENOENT
//   TESSERA_IO_FAULT_COUNT  fail only the first N matching calls of this process (a transient
//                           fault); unset or negative: every call
//   TESSERA_IO_FAULT_RANK   only in the process whose TESSERA_RANK is this (one rank of a job)
// read and fsync take a descriptor: its path comes from /proc/self/fd. Each injected failure is
// reported on stderr, so a test can tell that the fault was reached.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static atomic_long injected;

static int fault_errno(void) {
  const char* e = getenv("TESSERA_IO_FAULT_ERRNO");
  if (e == NULL || strcmp(e, "EIO") == 0) return EIO;
  if (strcmp(e, "ESTALE") == 0) return ESTALE;
  if (strcmp(e, "EACCES") == 0) return EACCES;
  if (strcmp(e, "ENOSPC") == 0) return ENOSPC;
  if (strcmp(e, "ENOENT") == 0) return ENOENT;
  return EIO;
}

// Whether a call `op` on `path` fails; sets errno when it does.
static int should_fail(const char* op, const char* path) {
  const char* pattern = getenv("TESSERA_IO_FAULT_PATH");
  if (pattern == NULL || *pattern == '\0' || path == NULL) return 0;
  const size_t plen = strlen(pattern), path_len = strlen(path);
  if (pattern[plen - 1] == '$') {
    if (path_len < plen - 1 || strncmp(path + path_len - (plen - 1), pattern, plen - 1) != 0) return 0;
  } else if (strstr(path, pattern) == NULL) {
    return 0;
  }
  const char* rank = getenv("TESSERA_IO_FAULT_RANK");
  const char* mine = getenv("TESSERA_RANK");
  if (rank != NULL && *rank != '\0' && (mine == NULL || strcmp(rank, mine) != 0)) return 0;
  const char* ops = getenv("TESSERA_IO_FAULT_OPS");
  if (ops != NULL && *ops != '\0') {
    const size_t n = strlen(op);
    const char* at = ops;
    int listed = 0;
    while ((at = strstr(at, op)) != NULL) {
      if ((at == ops || at[-1] == ',') && (at[n] == '\0' || at[n] == ',')) listed = 1;
      at += n;
    }
    if (!listed) return 0;
  }
  const char* count = getenv("TESSERA_IO_FAULT_COUNT");
  const long limit = count == NULL ? -1 : strtol(count, NULL, 10);
  const long k = atomic_fetch_add(&injected, 1);
  if (limit >= 0 && k >= limit) return 0;
  const int err = fault_errno();
  char line[512];
  const int len = snprintf(line, sizeof(line), "io_faults: %s %s -> %s\n", op, path, strerror(err));
  if (len > 0) (void)!write(2, line, (size_t)len < sizeof(line) ? (size_t)len : sizeof(line) - 1);
  errno = err;
  return 1;
}

static int fd_fails(const char* op, int fd) {
  if (getenv("TESSERA_IO_FAULT_PATH") == NULL) return 0;
  char link[64], path[4096];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof(path) - 1);
  if (n <= 0) return 0;
  path[n] = '\0';
  return should_fail(op, path);
}

#define NEXT(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

int stat(const char* path, struct stat* st) { return should_fail("stat", path) ? -1 : NEXT(stat)(path, st); }
int stat64(const char* path, struct stat64* st) { return should_fail("stat", path) ? -1 : NEXT(stat64)(path, st); }
int lstat(const char* path, struct stat* st) { return should_fail("stat", path) ? -1 : NEXT(lstat)(path, st); }
int lstat64(const char* path, struct stat64* st) { return should_fail("stat", path) ? -1 : NEXT(lstat64)(path, st); }
int fstatat(int dir, const char* path, struct stat* st, int flags) {
  return should_fail("stat", path) ? -1 : NEXT(fstatat)(dir, path, st, flags);
}
int fstatat64(int dir, const char* path, struct stat64* st, int flags) {
  return should_fail("stat", path) ? -1 : NEXT(fstatat64)(dir, path, st, flags);
}
int statx(int dir, const char* path, int flags, unsigned mask, struct statx* st) {
  return should_fail("stat", path) ? -1 : NEXT(statx)(dir, path, flags, mask, st);
}
int access(const char* path, int mode) { return should_fail("stat", path) ? -1 : NEXT(access)(path, mode); }

static mode_t mode_arg(int flags, va_list ap) { return (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, mode_t) : 0; }

int open(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return should_fail("open", path) ? -1 : NEXT(open)(path, flags, mode);
}
int open64(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return should_fail("open", path) ? -1 : NEXT(open64)(path, flags, mode);
}
int openat(int dir, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return should_fail("open", path) ? -1 : NEXT(openat)(dir, path, flags, mode);
}
int openat64(int dir, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return should_fail("open", path) ? -1 : NEXT(openat64)(dir, path, flags, mode);
}

// std::ifstream and std::ofstream open through fopen, which reaches the kernel without open().
FILE* fopen(const char* path, const char* mode) { return should_fail("open", path) ? NULL : NEXT(fopen)(path, mode); }
FILE* fopen64(const char* path, const char* mode) {
  return should_fail("open", path) ? NULL : NEXT(fopen64)(path, mode);
}

ssize_t read(int fd, void* buf, size_t n) { return fd_fails("read", fd) ? -1 : NEXT(read)(fd, buf, n); }
ssize_t pread(int fd, void* buf, size_t n, off_t at) { return fd_fails("read", fd) ? -1 : NEXT(pread)(fd, buf, n, at); }
ssize_t pread64(int fd, void* buf, size_t n, off64_t at) {
  return fd_fails("read", fd) ? -1 : NEXT(pread64)(fd, buf, n, at);
}
int fsync(int fd) { return fd_fails("fsync", fd) ? -1 : NEXT(fsync)(fd); }
int fdatasync(int fd) { return fd_fails("fsync", fd) ? -1 : NEXT(fdatasync)(fd); }
