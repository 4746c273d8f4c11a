"""Checks a `tessera report` page as headless Chromium rendered it (tests/report_test.sh).

usage: report_check.py --page HTML --dom DUMPED_DOM --png SCREENSHOT --metrics METRICS_JSONL

- the page is self-contained: no script, no stylesheet or image link, no URL but the SVG namespace;
- every figure (plot-loss, plot-throughput, plot-mfu, plot-time-split, plot-memory, plot-ranks) is
  in the DOM; one whose keys metrics.jsonl holds has an <svg> with elements of class "series"
  (one per rank for the per-rank plots), one without has a note and no <svg>;
- the screenshot is not blank: enough non-white pixels and colours, and the first series colour
  (drawn by the SVG legend) among them.
Only the standard library and numpy (python3-numpy).
"""
import argparse
import json
import re
import struct
import sys
import zlib
from html.parser import HTMLParser

import numpy as np

SPLIT = ["data_wait_s", "forward_s", "backward_s", "comm_s", "optimizer_s", "other_s", "checkpoint_s"]
# figure id -> (keys that give it data, number of series expected from a record)
FIGURES = {
    "plot-loss": (["loss", "val_loss"], lambda keys, w: len({"loss", "val_loss"} & keys)),
    "plot-throughput": (["tokens_per_s"], lambda keys, w: 1),
    "plot-mfu": (["mfu"], lambda keys, w: 1),
    "plot-time-split": (SPLIT, lambda keys, w: len(set(SPLIT) & keys)),
    "plot-memory": (["rss_bytes", "peak_rss_bytes", "rank_rss_bytes"],
                    lambda keys, w: len({"rss_bytes", "peak_rss_bytes"} & keys) + (w if "rank_rss_bytes" in keys else 0)),
    "plot-ranks": (["rank_busy_s"], lambda keys, w: w),
}
FIRST_COLOUR = (0x4E, 0x79, 0xA7)


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


class Figures(HTMLParser):
    """Per figure id: svg elements, elements of class series, notes."""

    def __init__(self):
        super().__init__()
        self.figures, self.current, self.depth = {}, None, 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "figure":
            self.current = a.get("id")
            self.figures[self.current] = {"svg": 0, "series": 0, "note": 0}
        if self.current is None:
            return
        f = self.figures[self.current]
        classes = (a.get("class") or "").split()
        f["svg"] += tag == "svg"
        f["series"] += "series" in classes
        f["note"] += "note" in classes

    def handle_endtag(self, tag):
        if tag == "figure":
            self.current = None


def png_pixels(path):
    """RGB(A) 8-bit non-interlaced PNG -> array [height, width, channels]."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path} is not a PNG")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        fail(f"{path}: unexpected PNG format {header}")
    bpp = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, width * bpp + 1)
    out = np.zeros((height, width * bpp), dtype=np.uint8)
    prior = np.zeros(width * bpp, dtype=np.uint8)
    for y in range(height):
        kind, row = raw[y, 0], raw[y, 1:]
        if kind == 0:
            cur = row.copy()
        elif kind == 2:  # up
            cur = row + prior
        elif kind == 1:  # sub: running sum per channel
            cur = (np.cumsum(row.reshape(width, bpp).astype(np.uint64), axis=0) % 256).astype(np.uint8).ravel()
        else:  # average or Paeth: byte by byte
            cur, r, p = bytearray(row.tobytes()), row.tolist(), prior.tolist()
            for i in range(len(cur)):
                left = cur[i - bpp] if i >= bpp else 0
                up, corner = p[i], p[i - bpp] if i >= bpp else 0
                if kind == 3:
                    cur[i] = (r[i] + (left + up) // 2) & 255
                else:
                    est = left + up - corner
                    pa, pb, pc = abs(est - left), abs(est - up), abs(est - corner)
                    cur[i] = (r[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
            cur = np.frombuffer(bytes(cur), dtype=np.uint8)
        out[y] = cur
        prior = cur
    return out.reshape(height, width, bpp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--page", required=True)
    ap.add_argument("--dom", required=True)
    ap.add_argument("--png", required=True)
    ap.add_argument("--metrics", required=True)
    args = ap.parse_args()

    page = open(args.page, encoding="utf-8").read()
    if re.search(r"<script|<link|<img|<iframe|@import|url\(", page, re.I):
        fail("the page loads or runs something (script, link, img, iframe, @import or url())")
    urls = set(re.findall(r"https?://[^\s\"'<>]+", page)) - {"http://www.w3.org/2000/svg"}
    if urls:
        fail(f"the page names URLs: {sorted(urls)[:5]}")

    keys, world = set(), 1
    for line in open(args.metrics):
        if line.strip():
            record = json.loads(line)
            keys |= {k for k, v in record.items() if v is not None}
            world = max(world, len(record.get("rank_busy_s", [])), len(record.get("rank_rss_bytes", [])))

    parser = Figures()
    parser.feed(open(args.dom, encoding="utf-8").read())
    figures = parser.figures
    if not keys:
        if "no steps recorded" not in page:
            fail("an empty metrics.jsonl gives no 'no steps recorded' note")
    for fid, (data_keys, expected) in FIGURES.items():
        if not keys:
            break
        if fid not in figures:
            fail(f"figure {fid} is not in the DOM (figures: {sorted(figures)})")
        f = figures[fid]
        has_data = bool(set(data_keys) & keys) and (fid != "plot-ranks" or world > 1)
        if has_data:
            want = expected(keys, world)
            if f["svg"] != 1 or f["series"] < want:
                fail(f"{fid}: {f['svg']} svg, {f['series']} series; want 1 svg and {want} series")
        elif f["svg"] != 0 or f["note"] != 1:
            fail(f"{fid}: no data for it in metrics.jsonl, yet {f['svg']} svg and {f['note']} notes (want a note)")
        print(f"ok: {fid}: " + (f"{f['series']} series" if has_data else "note"))

    pixels = png_pixels(args.png)[:, :, :3]
    flat = pixels.reshape(-1, 3)
    non_white = float(np.mean(np.any(flat < 245, axis=1)))
    colours = len(np.unique(flat[:: 7], axis=0))
    has_first = bool(np.any(np.all(flat == FIRST_COLOUR, axis=1)))
    print(f"screenshot {pixels.shape[1]}x{pixels.shape[0]}: {non_white:.1%} non-white, {colours} colours "
          f"(sampled), series colour {'present' if has_first else 'absent'}")
    if non_white < 0.01 or colours < 16:
        fail("the screenshot is (nearly) blank")
    if keys and not has_first:
        fail("the screenshot lacks the first series colour: no chart was drawn")


if __name__ == "__main__":
    main()
