#!/usr/bin/env python3
"""A stranger on a TCP store port (RELIABILITY.md row 23), for tests/adversarial_test.sh.

Against HOST:PORT, without the job token: forged hellos (reads every reply), requests without a
hello, random bytes, frames announcing 32 MiB, and IDLE connections held open for HOLD seconds.
Prints one JSON line: what it sent, how many connections the server closed, and whether any
reply contained SECRET (the job's token, passed only so that the check can be made).
usage: store_stranger.py HOST PORT SECRET [IDLE] [HOLD]
"""
import json
import os
import socket
import struct
import sys
import time

HELLO, SET, GET = 1, 2, 3


def frame(op, key, value):
    return bytes([op]) + struct.pack("<I", len(key)) + key + struct.pack("<I", len(value)) + value


def connect(host, port):
    s = socket.create_connection((host, port), timeout=2)
    s.settimeout(2)
    return s


def read_until_closed(s):
    """What the server sends until it closes (True) or goes quiet for the socket's timeout."""
    out = b""
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                return out, True
            out += chunk
    except ConnectionResetError:  # closed with our unread bytes still queued
        return out, True
    except socket.timeout:
        return out, False


def main():
    host, port, secret = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
    idle_n = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
    hold = float(sys.argv[5]) if len(sys.argv) > 5 else 6.0
    seen, closed, sent = b"", 0, {"forged": 0, "unauthenticated": 0, "junk": 0, "oversized": 0}
    attacks = [("forged", frame(HELLO, os.urandom(32), os.urandom(32))),
               ("forged", frame(HELLO, b"", b"")),
               ("unauthenticated", frame(GET, b"0.0.checkpoint/checkpoint.1.rank0", b"")),
               ("unauthenticated", frame(SET, b"0.0.checkpoint/checkpoint.9.rank0", b"ok"))]
    attacks += [("junk", os.urandom(1 + i * 97)) for i in range(50)]
    attacks += [("oversized", bytes([SET]) + struct.pack("<I", 32 << 20) + b"x" * 65536) for _ in range(20)]
    for kind, payload in attacks:
        s = connect(host, port)
        s.settimeout(6)  # a valid-looking prefix waits for the server's 5 s hello deadline
        try:
            s.sendall(payload)
        except OSError:
            pass
        got, was_closed = read_until_closed(s)
        seen += got
        closed += was_closed
        sent[kind] += 1
        s.close()
    idle = []
    t0 = time.time()
    for _ in range(idle_n):
        try:
            idle.append(connect(host, port))
        except OSError:
            break
    time.sleep(hold)
    idle_closed = 0
    for s in idle:
        s.settimeout(0.05)
        idle_closed += read_until_closed(s)[1]
        s.close()
    print(json.dumps({"sent": sent, "closed_by_server": closed, "attacks": len(attacks), "idle": len(idle),
                      "idle_closed_by_server": idle_closed, "idle_seconds": round(time.time() - t0, 2),
                      "secret_seen": secret in seen}))


if __name__ == "__main__":
    main()
