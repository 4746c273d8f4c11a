// Built-in fault injection for the reliability tests (RELIABILITY.md), inert unless the
// environment sets TESSERA_FAULT=RANK:STEP:PHASE:KIND, e.g. "0:4:checkpoint.shard:kill".
//   RANK   the global rank that acts (or * for every rank)
//   STEP   the 1-based optimizer step at which it acts (or * for any step); the health check
//          runs before the first step and counts as step 0
//   PHASE  where in the code:
//          health               the health check before step 0 (train/health.h)
//          forward              before the step's first micro-batch
//          backward             before the backward of the step's last micro-batch, whose
//                               gradients are reduced as each unit's backward ends
//          optimizer            before the optimizer update
//          checkpoint.shard     half-way through writing this rank's shard file
//          checkpoint.manifest  before the manifest is renamed into place
//          checkpoint.commit    after the manifest rename, before `latest` is replaced
//          checkpoint.upload    before a node's object is uploaded to the object-store tier
//                               (rank 0: before its upload of the checkpoint, which then fails)
//          checkpoint.load      before this rank loads a checkpoint to resume from (STEP 0,
//                               as the health check; io: each read attempt fails as with EIO)
//          shm.attach           a host group maps its shared-memory segment at start-up (RANK:
//                               the rank in that group; io: the mapping fails, as in another
//                               IPC namespace or with /dev/shm full)
//   KIND   kill (SIGKILL itself), exit (exit code 1 at once), hang (stop forever), slow (sleep
//          2 s), io (the write at that point fails as on a full disk; checkpoint phases),
//          nan (the caller sets one of this rank's gradient values to NaN; backward only),
//          fail (this rank's health check fails: its GEMM result is corrupted; health only),
//          gpu (this rank's GPU health verdict fails as if NVML had reported XID 79, the GPU
//          fallen off the bus; on a CPU run, a GPU reading is made up for it; health only)
// The fault acts in the first attempt only (TESSERA_RESTART_COUNT unset or 0) unless
// TESSERA_FAULT_ALWAYS=1. A malformed TESSERA_FAULT ends the process with exit code 2.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::fault {

enum class Kind { kNone, kKill, kExit, kHang, kSlow, kIo, kNan, kFail, kGpu, kAllReduce };

// A parsed TESSERA_FAULT.
struct Spec {
  bool active = false;
  int rank = -1;      // -1: any
  int64_t step = -1;  // -1: any
  std::string phase;
  Kind kind = Kind::kNone;
  std::string kind_name;
};

// Parses RANK:STEP:PHASE:KIND; false with a message naming the part at fault.
bool parse(const std::string& text, Spec* spec, std::string* error);

// Acts on the configured fault if it matches (rank, step, phase); kill, exit and hang never
// return. Returns the kind the caller must act on (kIo: fail the operation as an I/O error;
// kNan: poison a gradient; kFail: fail the health check's GEMM; kGpu: its GPU verdict;
// kAllReduce: corrupt this rank's part of its known all-reduce), else kNone. Cheap when nothing
// is configured.
Kind point(const char* phase, int rank, int64_t step);

}  // namespace tessera::fault
