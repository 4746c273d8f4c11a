#!/usr/bin/env bash
# Regenerates data/kjv.txt.zst, the bundled training corpus: the King James Bible (public
# domain), one chapter per document, documents separated by a blank line, verses one per line
# without their references. Needs Debian's bible-kjv (its `bible` tool; the package is GPL-2+,
# the text it prints is public domain). Not run by the build: the output is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v bible >/dev/null || { echo "make_corpus: install bible-kjv (apt-get install bible-kjv)" >&2; exit 2; }
bible -f gen1:1-rev22:21 </dev/null |
  awk '{
    split($1, ref, ":");             # "Ge1:1" -> book+chapter "Ge1", verse "1"
    if (NR > 1 && ref[1] != chapter) printf "\n";
    chapter = ref[1];
    sub(/^[^ ]* /, "");
    print
  }' | zstd -19 -q -f -o data/kjv.txt.zst
zstd -l data/kjv.txt.zst
