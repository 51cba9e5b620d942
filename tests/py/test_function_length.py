#!/usr/bin/env python3
"""No function in the server (src/server) or the command-line tools (tools/) is longer than
80 lines, as the style guide asks (docs/STYLE.md) and the issue "One repository that stands
alone" required. A function here is what the formatter lays out as a definition: a `{` alone
in column 0 and the `}` that next stands alone in column 0. The test also checks that the scan
found functions at all, so that a change of layout cannot make it pass by reading nothing.
"""
import glob
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
LIMIT = 80


def functions(path):
    """(name, first line, length in lines) of each definition in the file."""
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i] == "{" and i > 0:
            k = i + 1
            while k < len(lines) and lines[k] != "}":
                k += 1
            names = re.findall(r"(\w+)\s*\(", " ".join(lines[max(0, i - 3):i]))
            yield (names[0] if names else "?"), i, k - i + 1
            i = k
        i += 1


def main():
    files = sorted(glob.glob(os.path.join(ROOT, "src", "server", "*.c")) +
                   glob.glob(os.path.join(ROOT, "tools", "*.c")))
    seen, long_ones = 0, []
    for f in files:
        for name, line, n in functions(f):
            seen += 1
            if n > LIMIT:
                long_ones.append((n, os.path.relpath(f, ROOT), name, line))
    print(f"{seen} functions in {len(files)} files")
    failures = 0
    if seen < 100:
        print(f"FAIL  only {seen} functions found: the scan does not read the code's layout")
        failures += 1
    for n, f, name, line in sorted(long_ones, reverse=True):
        print(f"FAIL  {f}:{line} {name}: {n} lines (at most {LIMIT})")
        failures += 1
    print("ok" if failures == 0 else f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
