"""test_check_ref.py: `lathe convert` + `lathe check-ref` against transformers' own numbers.

For each reference folder (tests/data/golden/qwen35-tiny-a and qwen2-tiny-a, and the llama
one in tests/data/llama-tiny-a, made with tools/hf_reference.py from a small
SmolLM2-shaped config), the HF checkpoint is converted to an F32 GGUF in $LATHE_BUILD_DIR
and checked: logits and loss within 1e-4, every parameter's gradient within 1e-3, greedy
ids equal. The JSON summary must say so too.

The checker must also be able to fail: the same model stored as F16 is off by more than
1e-4 in its logits, and a model checked against another model's reference is refused.
"""
import json
import os
import subprocess
import sys

BIN = os.environ.get("LATHE_BIN")
BUILD = os.environ.get("LATHE_BUILD_DIR")
SRC = os.environ.get("LATHE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN = os.path.join(SRC, "tests", "data", "golden")  # see its README.md
if not BIN or not BUILD:
    print("LATHE_BIN and LATHE_BUILD_DIR must be set")
    sys.exit(1)

CASES = {
    "qwen35-tiny-a": os.path.join(GOLDEN, "qwen35-tiny-a"),
    "qwen2-tiny-a": os.path.join(GOLDEN, "qwen2-tiny-a"),
    "llama-tiny-a": os.path.join(SRC, "tests", "data", "llama-tiny-a"),
}

OUT = os.path.join(BUILD, "check_ref")
os.makedirs(OUT, exist_ok=True)
passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAILED: {what}")


def run(args, timeout=600):
    return subprocess.run([BIN] + args, capture_output=True, text=True, timeout=timeout)


def convert(name, folder, outtype):
    gguf = os.path.join(OUT, f"{name}.{outtype}.gguf")
    r = run(["convert", folder, "-o", gguf, "--outtype", outtype])
    check(r.returncode == 0, f"convert {name} {outtype}: {r.stderr.strip()}")
    return gguf


def check_ref(gguf, ref, name):
    js = os.path.join(OUT, f"{name}.json")
    if os.path.exists(js):
        os.remove(js)
    r = run(["check-ref", gguf, ref, "--json", js])
    summary = json.load(open(js)) if os.path.exists(js) else None
    return r, summary


for name, folder in CASES.items():
    if not os.path.isdir(folder):
        check(False, f"missing reference folder {folder}")
        continue
    ref = os.path.join(folder, "reference.safetensors")
    gguf = convert(name, folder, "f32")
    r, s = check_ref(gguf, ref, name)
    print(r.stdout)
    check(r.returncode == 0, f"check-ref {name} exit {r.returncode}: {r.stderr.strip()}")
    check(s is not None and s["pass"] is True, f"check-ref {name}: JSON says {s}")
    if s:
        check(s["logits_rel_err"] <= 1e-4 and s["loss_rel_err"] <= 1e-4, f"{name}: logits/loss")
        check(s["n_grads"] > 0 and s["n_grads_over_tol"] == 0, f"{name}: gradients")
        check(s["greedy_n"] == 12 and s["greedy_match"] == 12, f"{name}: greedy")
        print(f"{name}: logits {s['logits_rel_err']:.2e}, loss {s['loss_rel_err']:.2e}, "
              f"worst gradient {s['grad_worst_rel_err']:.2e} ({s['grad_worst']})")

# the tolerance bites: F16 weights move the logits by more than 1e-4
name, folder = "qwen2-tiny-a", CASES["qwen2-tiny-a"]
gguf16 = convert(name, folder, "f16")
r, s = check_ref(gguf16, os.path.join(folder, "reference.safetensors"), name + ".f16")
check(r.returncode == 1, f"check-ref of an f16 model must fail, exit {r.returncode}")
check(s is not None and s["pass"] is False and s["logits_rel_err"] > 1e-4,
      f"f16 logits error {s and s['logits_rel_err']}")

# another model's reference: a mismatch is reported, never a pass
r, s = check_ref(os.path.join(OUT, "qwen2-tiny-a.f32.gguf"),
                 os.path.join(CASES["llama-tiny-a"], "reference.safetensors"), "mismatch")
check(r.returncode != 0, f"mismatched reference must fail, exit {r.returncode}")
check(r.stderr.strip() != "", "mismatched reference: a reason on stderr")

# --no-grads: a reference without gradients (what another engine can give: the interop suite
# writes llama.cpp's logits this way) is refused without it and checked with it;
# --logits-out writes lathe's logits, raw float32 [B, T, V]
try:
    import numpy as np
    from safetensors.numpy import load_file, save_file
except ImportError as e:
    print(f"--no-grads and --logits-out not checked: {e}")
else:
    name, folder = "llama-tiny-a", CASES["llama-tiny-a"]
    full = load_file(os.path.join(folder, "reference.safetensors"))
    gradless = os.path.join(OUT, "llama-tiny-a.no-grads.safetensors")
    save_file({k: v for k, v in full.items() if not k.startswith("grad.")}, gradless)
    gguf32 = os.path.join(OUT, "llama-tiny-a.f32.gguf")
    r, s = check_ref(gguf32, gradless, name + ".gradless")
    check(r.returncode != 0 and "grad." in r.stderr,
          f"a reference without gradients, no --no-grads: exit {r.returncode}, {r.stderr.strip()}")
    raw = os.path.join(OUT, "llama-tiny-a.logits.f32")
    if os.path.exists(raw):
        os.remove(raw)
    r = run(["check-ref", gguf32, gradless, "--no-grads", "--logits-out", raw])
    check(r.returncode == 0 and "gradients: not checked (--no-grads)" in r.stdout,
          f"--no-grads: exit {r.returncode}: {r.stdout[-800:]} {r.stderr.strip()}")
    want = full["logits"]
    got = np.fromfile(raw, dtype="<f4") if os.path.exists(raw) else np.zeros(0, np.float32)
    check(got.size == want.size and float(np.abs(got - want.reshape(-1)).max()) < 1e-4,
          f"--logits-out: {got.size} floats, want {want.size} within 1e-4 of the reference")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
