#!/usr/bin/env python3
"""test_train_lora_gguf.py: lathe's LoRA adapter files against llama.cpp's own GGUF library
(the PyPI gguf package), both ways.

1. An adapter written by lathe (`test_lora --write DIR`) is read with gguf.GGUFReader: the
   keys llama.cpp's loader checks (general.type = adapter, adapter.type = lora,
   adapter.lora.alpha as F32, general.architecture), the tensor names in pairs, lora_a with
   ne (n_in, rank) and lora_b with ne (rank, n_out) in GGUF order (numpy shapes reversed),
   and the values (a weighted checksum lathe printed).
2. An adapter written with gguf.GGUFWriter the way llama.cpp's convert_lora_to_gguf.py does
   (F16 and F32 tensors, numpy lora_a (rank, n_in), lora_b (n_out, rank)) is read by lathe
   (`test_lora --read MODEL ADAPTER`), checked against the model, and must print the same
   names, shapes and checksums numpy computes.
3. One with a lora_b of the wrong width is refused against the model, naming the weight.

Environment: LATHE_BUILD_DIR (holds tests/test_lora). Exit 77 when numpy or gguf is missing.
"""
import json
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
    import gguf
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

BUILD = os.environ.get("LATHE_BUILD_DIR", "")
TEST_LORA = os.path.join(BUILD, "tests", "test_lora")
TMP = os.path.join(BUILD or "/tmp", "test_train_lora_gguf.tmp")

passed = 0
failed = 0


def check(cond, msg):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"check failed: {msg}", file=sys.stderr)
    return cond


def checksum(arr):
    """sum of v[k] * (k % 13 + 1) over the flat data, as test_lora prints it."""
    flat = np.asarray(arr, dtype=np.float64).reshape(-1)
    w = (np.arange(flat.size) % 13 + 1).astype(np.float64)
    return float(np.dot(flat, w))


def close(a, b, rel=1e-5):
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


def field_value(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode()
    return f.parts[f.data[0]][0]


def test_lathe_written():
    out = subprocess.run([TEST_LORA, "--write", TMP], capture_output=True, text=True)
    if not check(out.returncode == 0, f"test_lora --write: {out.stderr}"):
        return
    info = json.loads(out.stdout)
    r = gguf.GGUFReader(os.path.join(TMP, "adapter.gguf"))
    check(field_value(r, "general.type") == "adapter", "general.type")
    check(field_value(r, "adapter.type") == "lora", "adapter.type")
    check(field_value(r, "general.architecture") == "llama", "general.architecture")
    alpha = r.fields["adapter.lora.alpha"]
    check(alpha.types[0] == gguf.GGUFValueType.FLOAT32 and float(alpha.parts[alpha.data[0]][0]) == 8.0,
          "adapter.lora.alpha is F32 8")
    names = [t.name for t in r.tensors]
    want = []
    for p in info["pairs"]:
        want += [p["weight"] + ".lora_a", p["weight"] + ".lora_b"]
    check(names == want, f"tensor names in pairs: {names[:4]}...")
    by_name = {t.name: t for t in r.tensors}
    for p in info["pairs"]:
        ta, tb = by_name[p["weight"] + ".lora_a"], by_name[p["weight"] + ".lora_b"]
        check(list(ta.shape) == p["a"] and list(tb.shape) == p["b"],
              f"{p['weight']}: ne {list(ta.shape)} {list(tb.shape)} vs {p['a']} {p['b']}")
        n_in, rank = p["a"]
        n_out = p["b"][1]
        check(ta.data.shape == (rank, n_in) and tb.data.shape == (n_out, rank),
              f"{p['weight']}: numpy shapes {ta.data.shape} {tb.data.shape}")
        check(ta.tensor_type == gguf.GGMLQuantizationType.F32, "F32 lora_a")
        check(close(checksum(ta.data), p["a_sum"]) and close(checksum(tb.data), p["b_sum"]),
              f"{p['weight']}: values")
    # the weights adapted exist in the model with matching shapes (llama.cpp's own check)
    m = gguf.GGUFReader(os.path.join(TMP, "model.gguf"))
    mt = {t.name: t for t in m.tensors}
    for p in info["pairs"]:
        w = mt.get(p["weight"])
        check(w is not None and int(w.shape[0]) == p["a"][0] and int(w.shape[1]) == p["b"][1],
              f"{p['weight']} matches the model")


def write_llamacpp_style(path, pairs, alpha):
    w = gguf.GGUFWriter(path, "llama")
    w.add_string(gguf.Keys.General.TYPE, gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for name, a, b in pairs:
        w.add_tensor(name + ".lora_a", a)
        w.add_tensor(name + ".lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_llamacpp_written():
    model = os.path.join(TMP, "model.gguf")
    rng = np.random.default_rng(1)
    # model: n_embd 32, 4 heads of 8, 2 kv heads, n_ff 48
    pairs = [
        ("blk.0.attn_k.weight", rng.standard_normal((4, 32)).astype(np.float16),
         rng.standard_normal((16, 4)).astype(np.float16)),
        ("blk.1.ffn_down.weight", rng.standard_normal((4, 48)).astype(np.float32),
         rng.standard_normal((32, 4)).astype(np.float32)),
    ]
    path = os.path.join(TMP, "llamacpp_adapter.gguf")
    write_llamacpp_style(path, pairs, 16.0)
    out = subprocess.run([TEST_LORA, "--read", model, path], capture_output=True, text=True)
    if not check(out.returncode == 0, f"test_lora --read: {out.stderr}"):
        return
    info = json.loads(out.stdout)
    check(info["arch"] == "llama" and info["alpha"] == 16.0, f"arch/alpha {info['arch']} {info['alpha']}")
    check(len(info["pairs"]) == 2, "two pairs")
    for (name, a, b), p in zip(pairs, info["pairs"]):
        check(p["weight"] == name, f"{p['weight']} == {name}")
        check(p["a"] == [a.shape[1], a.shape[0]] and p["b"] == [b.shape[1], b.shape[0]],
              f"{name}: ne {p['a']} {p['b']}")
        check(close(checksum(a.astype(np.float64)), p["a_sum"]) and
              close(checksum(b.astype(np.float64)), p["b_sum"]), f"{name}: values")

    bad = [("blk.0.attn_k.weight", np.ones((4, 32), np.float32), np.ones((20, 4), np.float32))]
    path = os.path.join(TMP, "bad_adapter.gguf")
    write_llamacpp_style(path, bad, 8.0)
    out = subprocess.run([TEST_LORA, "--read", model, path], capture_output=True, text=True)
    check(out.returncode != 0 and "blk.0.attn_k.weight" in out.stderr,
          f"a mismatched adapter is refused: {out.stderr.strip()}")


def main():
    if not os.path.exists(TEST_LORA):
        print(f"skipped: {TEST_LORA} is not built")
        return 77
    shutil.rmtree(TMP, ignore_errors=True)
    os.makedirs(TMP)
    test_lathe_written()
    test_llamacpp_written()
    shutil.rmtree(TMP, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
