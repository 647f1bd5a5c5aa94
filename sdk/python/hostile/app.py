"""A deliberately misbehaving Python transform, for the host's tests: each
record's value names what it tries, and the row it writes (target `probe`:
offset, what, n, text) says what it got. It proves that WASI is
deterministic and gives no access, and that the sandbox holds.

- `clock`: n = the wall clock in ms (must be the batch time)
- `sleep`: n = monotonic ns that pass over time.sleep(3600) (virtual:
  3600 s, at once)
- `random`: n = 62 bits of `random`, text = os.urandom(8) in hex
- `file`: tries to read /etc/passwd; text = the error
- `listdir`: tries to list /; text = the error or what it saw
- `socket`: tries to connect to 127.0.0.1:5432; text = the error
- `env`: n = number of environment variables
- `print`: prints 20,000 lines
- `spin`, `bomb`, `recurse`, `raise`, `exit`: loops forever, allocates
  without end, recurses without end, raises, calls sys.exit(3)
- anything else: echoed (n = its length)
"""

import os
import random
import socket
import sys
import time

from sluice_plugin import Transform, export


def attempt(action):
    try:
        return 1, repr(action())
    except BaseException as e:  # SystemExit too: report, never escape
        return 0, f"{type(e).__name__}: {e}"


def recurse(n):
    return recurse(n + 1) + 1


class Hostile(Transform):
    def process(self, batch, out):
        t = out.target("probe", offset="int64", what="text", n="int64", text="text")
        for r in batch:
            what = r.text()
            n, text = 0, ""
            if what == "clock":
                n = time.time_ns() // 1_000_000
            elif what == "sleep":
                before = time.monotonic_ns()
                time.sleep(3600)
                n = time.monotonic_ns() - before
            elif what == "random":
                n = random.getrandbits(62)
                text = os.urandom(8).hex()
            elif what == "file":
                n, text = attempt(lambda: open("/etc/passwd").read(100))
            elif what == "listdir":
                n, text = attempt(lambda: os.listdir("/"))
            elif what == "socket":
                n, text = attempt(lambda: socket.socket().connect(("127.0.0.1", 5432)))
            elif what == "env":
                n = len(os.environ)
            elif what == "print":
                for i in range(20_000):
                    print(f"line {i} of a flood")
            elif what == "spin":
                while True:
                    pass
            elif what == "bomb":
                hoard = []
                while True:
                    hoard.append(bytearray(1 << 20))
            elif what == "recurse":
                sys.setrecursionlimit(100_000_000)  # frames on the heap: the memory cap stops it
                recurse(0)
            elif what == "raise":
                raise ValueError("hostile plugin raises on purpose")
            elif what == "exit":
                sys.exit(3)
            else:
                n = len(what)
            out.row(t, r.offset, what, n, text)


WitWorld = export(Hostile)
