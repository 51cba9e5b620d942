"""test_quant_cross.py: lathe's GGUF block formats against the gguf package's numpy code.

For every quantised type lathe reads, block bytes are dequantised by lathe (through
$LATHE_BUILD_DIR/tests/test_quant --dequant) and by gguf.quants.dequantize, and the floats
must match bit for bit (at most 1 ulp is tolerated and counted, but reported). For the
types lathe writes, lathe's quantised bytes must equal gguf.quants.quantize's.

Bytes come from gguf.quants.quantize where gguf can quantise the type, otherwise they are
random with sane f16 scales. gguf has no Q8_1 or Q8_K code; for those the reference is
numpy written here from the layout (d * q). Q8_1 is ggml's current 36-byte block (f16 d,
f16 s, qs[32]); gguf-py's size table still lists the old 40-byte one (f32 d and s), so the
size is overridden here. Exit 77 (skipped) without numpy/gguf.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from gguf import quants
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

BUILD = os.environ.get("LATHE_BUILD_DIR")
if not BUILD:
    print("LATHE_BUILD_DIR is not set")
    sys.exit(1)
TOOL = os.path.join(BUILD, "tests", "test_quant")
if not os.path.exists(TOOL):
    print(f"missing {TOOL} (build the test_quant target)")
    sys.exit(1)

QUANTISED = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]  # lathe writes these
READ_ONLY = ["Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"]
F16_FIELDS = {  # byte offsets of f16 scales inside a block
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q8_1": [0, 2],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "Q8_K": [],
}

SIZES = dict(GGML_QUANT_SIZES)
SIZES[T.Q8_1] = (32, 36)

rng = np.random.default_rng(1234)
tmp = tempfile.mkdtemp(prefix="lathe_quant_")
failures = []


def run_tool(mode, tname, data: bytes) -> bytes:
    src = os.path.join(tmp, "in.bin")
    dst = os.path.join(tmp, "out.bin")
    with open(src, "wb") as f:
        f.write(data)
    r = subprocess.run([TOOL, mode, tname.lower(), src, dst], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{TOOL} {mode} {tname}: rc {r.returncode}: {r.stderr.strip()}")
    with open(dst, "rb") as f:
        return f.read()


def ulp_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in units in the last place (float32), with -0 == +0 and nan == nan."""
    def ordered(x):
        i = x.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    d = np.abs(ordered(a) - ordered(b))
    both_nan = np.isnan(a) & np.isnan(b)
    return np.where(both_nan, 0, d)


def random_blocks(tname: str, nblocks: int) -> np.ndarray:
    """Random block bytes with finite f16 scales, some subnormal or zero."""
    bs, ts = SIZES[T[tname]]
    raw = rng.integers(0, 256, size=(nblocks, ts), dtype=np.uint8)
    for off in F16_FIELDS[tname]:
        v = rng.uniform(-3, 3, size=nblocks).astype(np.float16)
        v[::17] = np.float16(0)
        v[5::23] = np.float16(3e-6)  # subnormal half
        v[7::29] = np.float16(-6.1e-5)
        raw[:, off:off + 2] = v.view(np.uint8).reshape(nblocks, 2)
    if tname == "Q8_K":
        d = (rng.uniform(-1, 1, size=nblocks) * 1e-2).astype(np.float32)
        raw[:, 0:4] = d.view(np.uint8).reshape(nblocks, 4)
    return raw


def reference_dequant(tname: str, raw: np.ndarray) -> np.ndarray:
    if tname == "Q8_1":  # d (f16), s (f16), qs[32]
        d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
        q = raw[:, 4:36].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)
    if tname == "Q8_K":  # d (f32), qs[256], bsums[16] (int16)
        d = raw[:, 0:4].copy().view(np.float32)
        q = raw[:, 4:260].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)
    return np.asarray(quants.dequantize(raw, T[tname]), dtype=np.float32).reshape(-1)


def check_dequant(tname: str, raw: np.ndarray, label: str):
    ref = reference_dequant(tname, raw)
    got = np.frombuffer(run_tool("--dequant", tname, raw.tobytes()), dtype=np.float32)
    if got.shape != ref.shape:
        failures.append(f"{tname} {label}: {got.shape[0]} floats, expected {ref.shape[0]}")
        return
    u = ulp_diff(got, ref)
    inexact = int(np.count_nonzero(u))
    worst = int(u.max()) if u.size else 0
    status = "exact" if inexact == 0 else f"{inexact} values off, worst {worst} ulp"
    print(f"  {tname:5s} dequant {label:9s} {ref.size:7d} values: {status}")
    if worst > 1:
        i = int(np.argmax(u))
        failures.append(f"{tname} {label}: element {i}: lathe {got[i]!r} gguf {ref[i]!r} ({worst} ulp)")


def test_rows(n_blocks_32: int) -> np.ndarray:
    """Rows of assorted shapes, n_blocks_32 * 32 values each."""
    n = n_blocks_32 * 32
    rows = [
        rng.standard_normal(n),
        rng.uniform(-1, 1, n) * 1e-3,
        5 + rng.uniform(0, 1, n),
        rng.standard_normal(n) * np.where(rng.uniform(0, 1, n) < 0.02, 100, 0.1),
        np.zeros(n),
        np.full(n, -0.75),
        np.tile([1.0, -1.0, 0.25, -0.5], n // 4),          # ties of +-max
        np.round(rng.standard_normal(n) * 8) / 8,          # values on a coarse grid: rounding ties
        rng.standard_normal(n) * 1e-6,                     # d in f16 subnormal range
        rng.standard_normal(n) * 3e4,                      # large d
    ]
    return np.stack(rows).astype(np.float32)


def contraction_sensitive_blocks(tname: str, want: int = 32) -> np.ndarray:
    """Blocks where the quantiser's "x * id + offset" truncates differently when the
    multiply-add is fused: they catch a build that lets the compiler form FMAs (GNU C mode
    does on aarch64 and with -march flags that have FMA). Only Q4_0 and Q5_0 have them: their
    products are negative and the offset cancels them, so the product's rounding error is
    larger than the sum's ulp. Q4_1 and Q5_1 add 0.5 to a non-negative product (a fused
    result rounds to the same integer side), and Q8_0 rounds a bare product."""
    found = []
    for batch in range(60):
        n = 50000
        kind = batch % 3
        if kind == 0:
            b = np.round(rng.standard_normal((n, 32)) * 16) / 16
        elif kind == 1:
            b = rng.integers(-40, 40, (n, 32)) * 0.1
        else:
            b = rng.standard_normal((n, 32))
        b = b.astype(np.float32)
        if tname in ("Q4_0", "Q5_0"):
            imax = np.abs(b).argmax(axis=-1)[:, None]
            d = np.take_along_axis(b, imax, -1) / np.float32(-8 if tname == "Q4_0" else -16)
            base, off = b, np.float32(8.5 if tname == "Q4_0" else 16.5)
        else:
            lo, hi = b.min(-1, keepdims=True), b.max(-1, keepdims=True)
            d = (hi - lo) / np.float32(15 if tname == "Q4_1" else 31)
            base, off = b - lo, np.float32(0.5)
        with np.errstate(divide="ignore"):
            inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
        separate = np.trunc((base * inv) + off)
        fused = np.trunc((base.astype(np.float64) * inv.astype(np.float64) + off).astype(np.float32))
        found.append(b[np.any(separate != fused, axis=-1)])
        if sum(len(f) for f in found) >= want:
            break
    return np.concatenate(found)[:want]


def check_quant(tname: str, data: np.ndarray, label: str) -> np.ndarray:
    """lathe's quantised bytes against gguf's; returns gguf's bytes as (blocks, size)."""
    qt = T[tname]
    _, ts = SIZES[qt]
    with np.errstate(over="ignore"):  # the 3e4 row overflows Q4_1/Q5_1's f16 minimum
        ref = np.asarray(quants.quantize(data, qt), dtype=np.uint8).reshape(-1, ts)
    got = np.frombuffer(run_tool("--quant", tname, data.tobytes()), dtype=np.uint8)
    if got.size != ref.size:
        failures.append(f"{tname} quant {label}: {got.size} bytes, expected {ref.size}")
        return ref
    got = got.reshape(-1, ts)
    bad = np.nonzero(np.any(got != ref, axis=1))[0]
    print(f"  {tname:5s} quant   {label:9s} {ref.shape[0]:7d} blocks: "
          + ("bytes identical" if bad.size == 0 else f"{bad.size} blocks differ"))
    if bad.size:
        b = int(bad[0])
        failures.append(f"{tname} quant {label}: block {b} differs: lathe {got[b].tobytes().hex()} "
                        f"gguf {ref[b].tobytes().hex()}")
    return ref


def main():
    print(f"gguf quants: {quants.__file__}")
    data = test_rows(64)  # 10 rows x 2048 values
    for tname in QUANTISED:
        ref_bytes = check_quant(tname, data, "rows")
        if tname in ("Q4_0", "Q5_0"):
            blocks = contraction_sensitive_blocks(tname)
            if len(blocks) == 0:
                failures.append(f"{tname}: found no contraction-sensitive blocks")
            else:
                check_quant(tname, blocks, "fma-trap")
        check_dequant(tname, ref_bytes, "quantised")
        check_dequant(tname, random_blocks(tname, 512), "random")
    for tname in READ_ONLY:
        qt = T[tname]
        nb = 64 if SIZES[qt][0] == 256 else 512
        check_dequant(tname, random_blocks(tname, nb), "random")
    if failures:
        print("FAILED:")
        for f in failures:
            print("  " + f)
        return 1
    print("all types match gguf")
    return 0


if __name__ == "__main__":
    sys.exit(main())
