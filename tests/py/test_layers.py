#!/usr/bin/env python3
"""The include graph between src/'s folders (scripts/layers): its circles may only shrink.

A circle is a group of folders that include each other's headers, directly or through a
longer loop: the ops include autodiff/autodiff.h for their backward rules while autodiff.c
includes ops/op.h, and core/tensor.c reads the op table. (The refusal value went down to
core, lathe/refusal.h, which took backend and opt out of the circle.) The issue "One
repository that stands alone" asks for none between folders; KNOWN lists the ones left. A new
circle, or a known one that grew, fails this test. When a known one is gone, this test says
so and fails too, so that KNOWN is shortened in the same change.
"""
import importlib.machinery
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "layers")

# the circles left, each a sorted list of folders
KNOWN = [["autodiff", "core", "ops"]]


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
