// What every parser fuzz target shares: a scratch directory per process, the input written to a
// file in it (the parsers take paths), and the line between a rejection and a finding.
//
// A target defines LLVMFuzzerTestOneInput and write_seeds(). A parser may reject any input by
// throwing a tessera::Error; anything else (a sanitizer report, another exception escaping,
// std::bad_alloc, an allocation beyond libFuzzer's -malloc_limit_mb, a failed FUZZ_CHECK) is a
// finding. `NAME_fuzz --write-seeds=DIR` writes the target's seed corpus (valid files made by
// Tessera's own writers) into DIR and exits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "core/error.h"

namespace tessera::fuzz {

// Defined by each target: writes valid sample inputs into `dir` (which exists).
void write_seeds(const std::string& dir);

// This process's own directory: tessera-fuzz-XXXXXX under $TESSERA_FUZZ_TMPDIR, else /dev/shm,
// else $TMPDIR or /tmp. Removed at exit (not after a crash: fuzz.sh removes its base).
const std::string& scratch_dir();

// Writes the bytes to scratch_dir()/name, replacing what was there, and returns the path.
std::string write_input(const std::string& name, const uint8_t* data, size_t size);

// Prints the finding and aborts, so that libFuzzer saves the input as a crash.
[[noreturn]] void finding(const std::string& what);
[[noreturn]] void unexpected_exception(const std::exception* e);

// Runs parse(): true when it returned, false when it threw a tessera::Error (the expected
// rejection); any other exception is a finding.
template <typename F>
bool parses(F&& parse) {
  try {
    parse();
    return true;
  } catch (const Error&) {
    return false;
  } catch (const std::exception& e) {
    unexpected_exception(&e);
  } catch (...) {
    unexpected_exception(nullptr);
  }
}

}  // namespace tessera::fuzz

// A property an accepted input must have.
#define FUZZ_CHECK(cond)                                                                                              \
  do {                                                                                                                \
    if (!(cond))                                                                                                      \
      ::tessera::fuzz::finding(std::string(__FILE__ ":") + std::to_string(__LINE__) + ": FUZZ_CHECK failed: " #cond); \
  } while (0)
