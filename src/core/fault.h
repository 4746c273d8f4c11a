// Built-in fault injection for the reliability tests (RELIABILITY.md), inert unless the
// environment sets TESSERA_FAULT=RANK:STEP:PHASE:KIND, e.g. "0:4:checkpoint.shard:kill".
//   RANK   the global rank that acts (or * for every rank)
//   STEP   the 1-based optimizer step at which it acts (or * for any step)
//   PHASE  where in the code: checkpoint.shard (half-way through writing this rank's shard
//          file), checkpoint.manifest (before the manifest is renamed into place),
//          checkpoint.commit (after the manifest rename, before `latest` is replaced)
//   KIND   kill (SIGKILL itself), exit (exit code 1 at once), hang (stop forever), slow (sleep
//          2 s), io (the write at that point fails as on a full disk)
// The fault acts in the first attempt only (TESSERA_RESTART_COUNT unset or 0) unless
// TESSERA_FAULT_ALWAYS=1.
#pragma once

#include <cstdint>

namespace tessera::fault {

enum class Kind { kNone, kKill, kExit, kHang, kSlow, kIo };

// Acts on the configured fault if it matches (rank, step, phase); kill, exit and hang never
// return. Returns kIo when the caller must fail the operation as an I/O error, else kNone.
// Cheap when nothing is configured.
Kind point(const char* phase, int rank, int64_t step);

}  // namespace tessera::fault
