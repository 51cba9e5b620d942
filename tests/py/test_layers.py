#!/usr/bin/env python3
"""The include graph between src/'s folders (scripts/layers): its circles may only shrink.

A circle is a group of folders that include each other's headers, directly or through a
longer loop. The issue "One repository that stands alone" asked for none between folders;
the last one (autodiff, core and ops) went when the rules' gradient accumulation moved to
ops/grad.h, the row readers to core/tensor_access.h and the thread pool to core. KNOWN lists
the circles left (none). A new circle, or a known one that grew, fails this test; when a
known one is gone, this test says so and fails too, so that KNOWN is shortened in the same
change.
"""
import importlib.machinery
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "layers")

# the circles left, each a sorted list of folders
KNOWN = []


def main():
    loader = importlib.machinery.SourceFileLoader("layers", SCRIPT)
    spec = importlib.util.spec_from_loader("layers", loader)
    layers = importlib.util.module_from_spec(spec)
    loader.exec_module(layers)
    edges = layers.arrows()
    found = layers.circles(edges)
    failures = 0
    if not edges:
        print("FAIL  no arrows between folders at all: the scan read nothing")
        failures += 1
    for g in found:
        if g in KNOWN:
            print(f"known circle: {' <-> '.join(g)}")
        else:
            print(f"FAIL  a new or grown circle: {' <-> '.join(g)}")
            for (a, b), files in sorted(edges.items()):
                if a in g and b in g:
                    print(f"        {a} -> {b}: {', '.join(sorted(set(files)))}")
            failures += 1
    for g in KNOWN:
        if g not in found:
            print(f"FAIL  the circle {' <-> '.join(g)} is gone: drop it from KNOWN")
            failures += 1
    print(f"{len(edges)} arrows between folders, {len(found)} circles; {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
