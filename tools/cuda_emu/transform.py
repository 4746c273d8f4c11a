#!/usr/bin/env python3
"""Rewrites a .cu file for the CPU emulation (emu_device.h), changing only what g++ cannot compile:

  kernel<<<grid, block[, smem[, stream]]>>>(args)  ->  ::emu::Launch(grid, block[, smem[, stream]]).run(kernel, args)
  extern __shared__ [__align__(n)] T name[];        ->  T* name = static_cast<T*>(::emu::dynamic_smem());
  __shared__ [__align__(n)] T name[N]...;           ->  auto& name = ::emu::static_shared<T[N]...>([] {});

A static __shared__ array becomes a reference into a per-block arena, one per declaration site
(the lambda's unique type names the site), so every thread of a block sees the same array, as on
the device. Anything else spelled __shared__ is refused. A #line directive keeps the original
file's name and line numbers in diagnostics.

usage: transform.py in.cu out.cc
"""
import re
import sys

src_path, out_path = sys.argv[1], sys.argv[2]
s = open(src_path).read()

# Launches: the kernel name (with template arguments), then <<<config>>>(.
launch = re.compile(r"([A-Za-z_]\w*(?:\s*<[^<>;(){}]*>)?)\s*<<<(.*?)>>>\s*\(", re.S)
s, launches = launch.subn(lambda m: "::emu::Launch(%s).run(%s, " % (m.group(2), m.group(1)), s)

dyn = re.compile(r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([\w:]+)\s+(\w+)\s*\[\s*\]\s*;")
s, dyns = dyn.subn(lambda m: "%s* %s = static_cast<%s*>(::emu::dynamic_smem());" % (m.group(1), m.group(2), m.group(1)), s)

static = re.compile(r"__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([\w:<>]+)\s+(\w+)\s*((?:\[[^\]]+\]\s*)+);")
s, statics = static.subn(
    lambda m: "auto& %s = ::emu::static_shared<%s%s>([] {});" % (m.group(2), m.group(1), re.sub(r"\s+", "", m.group(3))),
    s)

left = [line for line in s.splitlines() if re.search(r"\b__shared__\b", line) or "<<<" in line or ">>>" in line]
if left:
    sys.exit("transform.py: %s: constructs left untranslated:\n  %s" % (src_path, "\n  ".join(left)))

with open(out_path, "w") as f:
    f.write('#include "emu_device.h"\n#line 1 "%s"\n' % src_path)
    f.write(s)
sys.stderr.write("%s: %d launches, %d dynamic and %d static shared arrays\n" % (src_path, launches, dyns, statics))
