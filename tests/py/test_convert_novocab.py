"""test_convert_novocab.py: `lathe convert` of a checkpoint without tokenizer files (issue 18,
item 9).

llama.cpp's converter writes tokenizer.ggml.model = "none" and {arch}.vocab_size for a model
without a vocabulary (TextModel._set_vocab_none + add_vocab_size); llama.cpp's loader then
makes vocab_size placeholder tokens and runs the model on token ids. A GGUF with no
tokenizer.ggml.model at all does not load there ("key not found in model:
tokenizer.ggml.model"), which is what lathe wrote before.

Checked here:
- a tiny SmolLM2-shaped llama checkpoint written here with numpy + safetensors (no torch), and
  the tokenizer-less golden Qwen2 and llama references, converted: the gguf package reads
  tokenizer.ggml.model == "none" (a string) and {arch}.vocab_size == config.json's
  vocab_size (a u32), and no other tokenizer.* key;
- a folder with only a SentencePiece tokenizer.model: converted the same way, with a warning
  that names the file lathe does not read;
- llama.cpp (llama-cpp-python, vocab_only=False) loads each file, reports n_vocab ==
  vocab_size and no BOS/EOS, evaluates token ids, and refuses an id >= vocab_size; on the
  golden references its logits match transformers' (reference.safetensors) within 1e-3
  relative (llama.cpp keeps an F16 KV cache: about 2e-4 here);
- lathe itself: `lathe info` reads the file, `lathe run` exits 1 with an error that says the
  model has no tokenizer (not a crash), and `lathe check-ref` still passes on the golden case.

Exits 77 (skipped) when numpy, gguf or safetensors is missing; the llama.cpp part is skipped
(and said so) when llama_cpp is missing."""
import json
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
    import gguf
    from safetensors.numpy import load_file, save_file
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

LATHE = os.environ.get("LATHE_BIN")
BUILD = os.environ.get("LATHE_BUILD_DIR", "/tmp")
SRC = os.environ.get("LATHE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN = os.path.join(SRC, "tests", "data", "golden")
TMP = os.path.join(BUILD, "test_convert_novocab.tmp")

passed = 0
failed = 0


def check(cond, msg):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {msg}", file=sys.stderr)
    return cond


def lathe(*args, timeout=300):
    return subprocess.run([LATHE, *args], capture_output=True, text=True, timeout=timeout)


def make_llama(d, vocab=320):
    """A SmolLM2-shaped LlamaForCausalLM (GQA, tied embeddings), config.json + model.safetensors
    only."""
    rng = np.random.default_rng(11)
    E, F, H, KV, L = 64, 96, 4, 2, 2
    hd = E // H
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": E,
           "intermediate_size": F, "num_attention_heads": H, "num_key_value_heads": KV,
           "num_hidden_layers": L, "vocab_size": vocab, "max_position_embeddings": 512,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
           "torch_dtype": "float32"}
    shapes = {"model.embed_tokens.weight": (vocab, E), "model.norm.weight": (E,)}
    for b in range(L):
        p = f"model.layers.{b}."
        shapes.update({p + "input_layernorm.weight": (E,), p + "post_attention_layernorm.weight": (E,),
                       p + "self_attn.q_proj.weight": (H * hd, E), p + "self_attn.k_proj.weight": (KV * hd, E),
                       p + "self_attn.v_proj.weight": (KV * hd, E), p + "self_attn.o_proj.weight": (E, H * hd),
                       p + "mlp.gate_proj.weight": (F, E), p + "mlp.up_proj.weight": (F, E),
                       p + "mlp.down_proj.weight": (E, F)})
    hf = {}
    for n, s in shapes.items():
        if n.endswith("norm.weight"):
            hf[n] = (1 + 0.1 * rng.standard_normal(s)).astype(np.float32)
        else:
            hf[n] = (0.1 * rng.standard_normal(s)).astype(np.float32)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    save_file(hf, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    return cfg


def convert(label, hf_dir, outtype="f32"):
    out = os.path.join(TMP, f"{label}-{outtype}.gguf")
    if os.path.exists(out):
        os.remove(out)
    p = lathe("convert", hf_dir, "-o", out, "--outtype", outtype)
    check(p.returncode == 0, f"{label}: convert failed: {p.stderr.strip()}")
    return out if os.path.exists(out) else None, p


def check_novocab_keys(label, path, cfg):
    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    f = r.fields.get("tokenizer.ggml.model")
    if check(f is not None, f"{label}: no tokenizer.ggml.model"):
        check(f.types == [gguf.GGUFValueType.STRING] and f.contents() == "none",
              f"{label}: tokenizer.ggml.model = {f.contents()!r} ({f.types}), want 'none'")
    key = f"{arch}.vocab_size"
    f = r.fields.get(key)
    if check(f is not None, f"{label}: no {key}"):
        check(f.types == [gguf.GGUFValueType.UINT32], f"{label}: {key} is {f.types}, not a u32")
        check(f.contents() == cfg["vocab_size"], f"{label}: {key} = {f.contents()}, want {cfg['vocab_size']}")
    others = sorted(k for k in r.fields if k.startswith("tokenizer.") and k != "tokenizer.ggml.model")
    check(not others, f"{label}: tokenizer keys beyond the model: {others}")
    embd = next(t for t in r.tensors if t.name == "token_embd.weight")
    check(int(embd.shape[1]) == cfg["vocab_size"], f"{label}: token_embd rows {embd.shape}")
    return arch


def check_lathe_side(label, path):
    p = lathe("info", path)
    check(p.returncode == 0 and "tokenizer.ggml.model" in p.stdout and '"none"' in p.stdout,
          f"{label}: lathe info: rc {p.returncode}: {p.stderr.strip()[:300]}")
    p = lathe("run", "-m", path, "-p", "hello", "-n", "2", "--backend", "cpu")
    check(p.returncode == 1, f"{label}: lathe run: rc {p.returncode}, want 1 (no crash)")
    check("no tokenizer" in p.stderr and "tokenizer.ggml.model" in p.stderr,
          f"{label}: lathe run's error does not name the missing tokenizer: {p.stderr.strip()[:300]}")


def llama_cpp_checks(label, path, cfg, ref=None):
    import llama_cpp
    V = cfg["vocab_size"]
    m = llama_cpp.Llama(model_path=path, vocab_only=False, n_ctx=64, n_batch=64, logits_all=True,
                        verbose=False)
    try:
        check(m.n_vocab() == V, f"{label}: llama.cpp n_vocab {m.n_vocab()}, want {V}")
        check(m.token_bos() == -1 and m.token_eos() == -1,
              f"{label}: llama.cpp special tokens {m.token_bos()}, {m.token_eos()} for a vocab-less model")
        ids = ref["input_ids"][0].tolist() if ref is not None else [1, 5, 17, V - 1, 42, 7]
        m.eval(ids)
        got = np.array(m.scores[: len(ids)], dtype=np.float32)
        check(got.shape == (len(ids), V) and np.all(np.isfinite(got)) and np.std(got) > 0,
              f"{label}: llama.cpp logits {got.shape}, finite {np.all(np.isfinite(got))}")
        if ref is not None:
            want = ref["logits"][0]
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            check(err < 1e-3, f"{label}: llama.cpp logits vs transformers: relative error {err:.3g}")
        m.reset()
        try:
            m.eval([3, V])  # an id past the vocabulary: llama_decode refuses the batch
            check(False, f"{label}: llama.cpp evaluated token id {V} >= n_vocab")
        except RuntimeError:
            check(True, "")
    finally:
        m.close()


def main():
    if not LATHE or not os.path.exists(LATHE):
        print("LATHE_BIN not set; skipped")
        return 77
    os.makedirs(TMP, exist_ok=True)
    try:
        import llama_cpp  # noqa: F401
        have_llama_cpp = True
    except ImportError:
        have_llama_cpp = False
        print("llama_cpp missing: the llama.cpp loads are skipped")

    # a tiny checkpoint made here, f32 and f16
    d = os.path.join(TMP, "llama-novocab")
    cfg = make_llama(d)
    files = []
    for outtype in ("f32", "f16"):
        out, p = convert("llama-novocab", d, outtype)
        if out:
            check(check_novocab_keys(f"llama-novocab/{outtype}", out, cfg) == "llama", "arch llama")
            check("warning" not in p.stderr, f"unexpected warning: {p.stderr.strip()}")
            files.append((f"llama-novocab/{outtype}", out, cfg, None))

    # only a SentencePiece tokenizer.model: lathe does not read it, says so, writes "none"
    d2 = os.path.join(TMP, "llama-spm-only")
    cfg2 = make_llama(d2, vocab=256)
    open(os.path.join(d2, "tokenizer.model"), "wb").write(b"\x0a\x00")
    out, p = convert("llama-spm-only", d2, "f16")
    check("warning" in p.stderr and "tokenizer.model" in p.stderr,
          f"llama-spm-only: no warning about tokenizer.model: {p.stderr.strip()}")
    if out:
        check_novocab_keys("llama-spm-only", out, cfg2)
        files.append(("llama-spm-only", out, cfg2, None))

    # the tokenizer-less references: qwen2 (whose hparams carry no vocab_size) and llama
    for name, folder in (("qwen2-tiny-a", os.path.join(GOLDEN, "qwen2-tiny-a")),
                         ("llama-tiny-a", os.path.join(SRC, "tests", "data", "llama-tiny-a"))):
        if not check(os.path.isdir(folder), f"missing {folder}"):
            continue
        gcfg = json.load(open(os.path.join(folder, "config.json")))
        out, _ = convert(name, folder, "f32")
        if not out:
            continue
        check_novocab_keys(name, out, gcfg)
        files.append((name, out, gcfg, load_file(os.path.join(folder, "reference.safetensors"))))
        if name == "qwen2-tiny-a":
            js = os.path.join(TMP, "qwen2-check-ref.json")
            p = lathe("check-ref", out, os.path.join(folder, "reference.safetensors"), "--json", js, timeout=600)
            check(p.returncode == 0, f"check-ref on the vocab-less qwen2: {p.stdout[-500:]} {p.stderr[-500:]}")

    for label, out, c, ref in files:
        check_lathe_side(label, out)
        if have_llama_cpp:
            try:
                llama_cpp_checks(label, out, c, ref)
            except Exception as e:  # a load failure is the bug this test is for
                check(False, f"{label}: llama.cpp: {type(e).__name__}: {e}")

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
