"""test_convert.py: `lathe convert` against llama.cpp's own GGUF reader (the PyPI gguf package).

For the golden Qwen3.5 and Qwen2 checkpoints (tests/data/golden) and a SmolLM2-shaped llama
checkpoint made here, with every --outtype, the converted file is read with gguf.GGUFReader
and checked for: tensor names and shapes, each tensor's type, every value against the HF
tensor under the transforms (written here independently in numpy, the way llama.cpp's
convert_hf_to_gguf.py writes them: -exp(A_log), +1 on (1+w) norms, grouped-to-tiled value
heads, llama's q/k row permutation, conv1d squeezed), the metadata keys and values, and the
tokenizer keys when a tokenizer.json is present (without one: tokenizer.ggml.model = "none"
and ARCH.vocab_size, as llama.cpp writes; tests/py/test_convert_novocab.py loads such files
in llama.cpp). Quantised and half-precision data must
equal, byte for byte, what gguf.quants.quantize makes of the transformed values. A failed
conversion must leave no file.

Exits 77 (skipped) when numpy, gguf or safetensors is missing."""
import json
import os
import shutil
import struct
import subprocess
import sys

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as QT
    from safetensors.numpy import load_file, save_file
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

LATHE = os.environ.get("LATHE_BIN")
BUILD = os.environ.get("LATHE_BUILD_DIR", "/tmp")
SRC = os.environ.get("LATHE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN = os.path.join(SRC, "tests", "data", "golden")  # see its README.md
TMP = os.path.join(BUILD, "test_convert.tmp")

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


# ---------------------------------------------------------------- helpers


def run_convert(hf_dir, out, outtype=None, expect_ok=True):
    cmd = [LATHE, "convert", hf_dir, "-o", out]
    if outtype:
        cmd += ["--outtype", outtype]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if expect_ok:
        check(p.returncode == 0, f"{' '.join(cmd)} failed: {p.stderr.strip()}")
    return p


def field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def field_type(r, key):
    f = r.fields.get(key)
    return None if f is None else f.types


def write_safetensors(path, tensors):
    """A minimal safetensors writer (so BF16 can be stored): tensors maps name -> (dtype, shape,
    raw bytes)."""
    header = {}
    offset = 0
    blobs = []
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def f32_to_bf16_bits(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


# ------------------------------------------------ the transforms, as llama.cpp writes them


def reorder_v_heads(t, dim, n_k, n_per_k, head_dim):
    """convert_hf_to_gguf.py's _LinearAttentionVReorderBase._reorder_v_heads, in numpy."""
    shape = list(t.shape)
    new_shape = shape[:dim] + [n_k, n_per_k, head_dim] + shape[dim + 1:]
    t = t.reshape(new_shape)
    perm = list(range(len(new_shape)))
    perm[dim], perm[dim + 1] = perm[dim + 1], perm[dim]
    return np.ascontiguousarray(t.transpose(perm)).reshape(shape)


def llama_permute(w, n_head, n_head_kv):
    """LlamaModel.permute"""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_qwen35(hf, cfg):
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    r = hv // hk
    out = {}
    for name, x in hf.items():
        x = x.astype(np.float32)
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = x
            continue
        if name == "model.norm.weight":
            out["output_norm.weight"] = x + 1
            continue
        if name == "lm_head.weight":
            out["output.weight"] = x
            continue
        parts = name.split(".")
        bid, rest = int(parts[2]), ".".join(parts[3:])
        blk = f"blk.{bid}."
        re = hk != hv
        if rest == "input_layernorm.weight":
            out[blk + "attn_norm.weight"] = x + 1
        elif rest == "post_attention_layernorm.weight":
            out[blk + "post_attention_norm.weight"] = x + 1
        elif rest == "self_attn.q_norm.weight":
            out[blk + "attn_q_norm.weight"] = x + 1
        elif rest == "self_attn.k_norm.weight":
            out[blk + "attn_k_norm.weight"] = x + 1
        elif rest.startswith("self_attn."):
            proj = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
            p, kind = rest.split(".")[1], rest.split(".")[2]
            out[blk + proj[p] + "." + kind] = x
        elif rest.startswith("mlp."):
            out[blk + "ffn_" + rest.split(".")[1].replace("_proj", "") + ".weight"] = x
        elif rest == "linear_attn.A_log":
            y = -np.exp(x)
            out[blk + "ssm_a"] = reorder_v_heads(y[:, None], 0, hk, r, 1)[:, 0] if re else y
        elif rest == "linear_attn.dt_bias":
            out[blk + "ssm_dt.bias"] = reorder_v_heads(x[:, None], 0, hk, r, 1)[:, 0] if re else x
        elif rest == "linear_attn.conv1d.weight":
            y = x.squeeze()
            if re:
                qk = 2 * hk * dk
                y = np.concatenate([y[:qk], reorder_v_heads(y[qk:], 0, hk, r, dv)], axis=0)
            out[blk + "ssm_conv1d.weight"] = y
        elif rest == "linear_attn.in_proj_qkv.weight":
            if re:
                qk = 2 * hk * dk
                x = np.concatenate([x[:qk], reorder_v_heads(x[qk:], 0, hk, r, dv)], axis=0)
            out[blk + "attn_qkv.weight"] = x
        elif rest == "linear_attn.in_proj_z.weight":
            out[blk + "attn_gate.weight"] = reorder_v_heads(x, 0, hk, r, dv) if re else x
        elif rest == "linear_attn.in_proj_a.weight":
            out[blk + "ssm_alpha.weight"] = reorder_v_heads(x, 0, hk, r, 1) if re else x
        elif rest == "linear_attn.in_proj_b.weight":
            out[blk + "ssm_beta.weight"] = reorder_v_heads(x, 0, hk, r, 1) if re else x
        elif rest == "linear_attn.norm.weight":
            out[blk + "ssm_norm.weight"] = x
        elif rest == "linear_attn.out_proj.weight":
            out[blk + "ssm_out.weight"] = reorder_v_heads(x, 1, hk, r, dv) if re else x
        else:
            raise AssertionError(f"test has no expectation for {name}")
    return out


def expected_dense(hf, cfg, llama):
    """qwen2 and llama: plain renames, plus llama's q/k permutation."""
    out = {}
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    for name, x in hf.items():
        x = x.astype(np.float32)
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = x
        elif name == "model.norm.weight":
            out["output_norm.weight"] = x
        elif name == "lm_head.weight":
            if not cfg.get("tie_word_embeddings"):
                out["output.weight"] = x
        else:
            parts = name.split(".")
            blk, rest = f"blk.{parts[2]}.", ".".join(parts[3:])
            if rest == "input_layernorm.weight":
                out[blk + "attn_norm.weight"] = x
            elif rest == "post_attention_layernorm.weight":
                out[blk + "ffn_norm.weight"] = x
            elif rest.startswith("self_attn."):
                proj = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
                p, kind = rest.split(".")[1], rest.split(".")[2]
                if llama and p == "q_proj":
                    x = llama_permute(x, nh, nh)
                elif llama and p == "k_proj":
                    x = llama_permute(x, nh, nkv)
                out[blk + proj[p] + "." + kind] = x
            elif rest.startswith("mlp."):
                out[blk + "ffn_" + rest.split(".")[1].replace("_proj", "") + ".weight"] = x
            else:
                raise AssertionError(f"test has no expectation for {name}")
    return out


OUTTYPES = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0}
FILE_TYPES = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7}


def expected_type(name, arr, outtype):
    """llama.cpp's prepare_tensors rule"""
    if arr.ndim <= 1 or name.endswith("_norm.weight") or name.endswith(".ssm_conv1d.weight") \
            or not name.endswith(".weight"):
        return QT.F32
    if outtype == "q8_0" and arr.shape[-1] % 32 != 0:
        return QT.F16
    return OUTTYPES[outtype]


def check_tensors(label, r, expected, outtype):
    names = [t.name for t in r.tensors]
    check(len(names) == len(set(names)), f"{label}: duplicate tensor names")
    check(set(names) == set(expected), f"{label}: tensor names differ: "
          f"extra {sorted(set(names) - set(expected))}, missing {sorted(set(expected) - set(names))}")
    for t in r.tensors:
        if t.name not in expected:
            continue
        want = expected[t.name]
        want_type = expected_type(t.name, want, outtype)
        check(t.tensor_type == want_type, f"{label}: {t.name} is {t.tensor_type.name}, want {want_type.name}")
        check(list(t.shape) == list(reversed(want.shape)),
              f"{label}: {t.name} ne {list(t.shape)}, want {list(reversed(want.shape))}")
        if t.tensor_type == QT.F32:
            got = np.asarray(t.data, dtype=np.float32).reshape(want.shape)
            if t.name.endswith(".ssm_a"):
                ok = np.allclose(got, want, rtol=1e-6, atol=0)
            else:
                ok = np.array_equal(got, want)
            check(ok, f"{label}: {t.name} values differ (max |d| {np.max(np.abs(got - want)) if got.size else 0})")
        else:
            raw = np.asarray(t.data).view(np.uint8).reshape(-1)
            ref = gguf.quants.quantize(want, t.tensor_type).view(np.uint8).reshape(-1)
            check(raw.size == ref.size and np.array_equal(raw, ref),
                  f"{label}: {t.name} {t.tensor_type.name} bytes differ from gguf.quants.quantize")
            deq = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(want.shape)
            tol = {QT.F16: 1e-3, QT.BF16: 8e-3, QT.Q8_0: 2e-2}[t.tensor_type]
            scale = np.max(np.abs(want)) if want.size else 1.0
            check(np.max(np.abs(deq - want)) <= tol * max(scale, 1e-6),
                  f"{label}: {t.name} dequantised values too far from the HF ones")


def check_keys(label, r, want):
    """want maps key -> value (None: present, any value). The file must hold exactly these keys."""
    have = {k for k in r.fields if not k.startswith("GGUF.")}
    check(have == set(want), f"{label}: keys differ: extra {sorted(have - set(want))}, "
          f"missing {sorted(set(want) - have)}")
    for k, v in want.items():
        if v is None or k not in r.fields:
            continue
        got = field(r, k)
        if isinstance(v, float):
            ok = isinstance(got, float) and abs(got - v) <= 1e-6 * abs(v)
        else:
            ok = got == v
        check(ok, f"{label}: {k} = {got!r}, want {v!r}")


def check_u32(label, r, keys):
    for k in keys:
        if k in r.fields:
            check(field_type(r, k) == [gguf.GGUFValueType.UINT32], f"{label}: {k} is not a u32")


def convert_and_read(label, hf_dir, outtype):
    out = os.path.join(TMP, f"{label}-{outtype}.gguf")
    if os.path.exists(out):
        os.remove(out)
    p = run_convert(hf_dir, out, outtype)
    if p.returncode != 0 or not check(os.path.exists(out), f"{label}: {out} not written"):
        return None
    return gguf.GGUFReader(out)


# ---------------------------------------------------------------- tokenizers made here

QWEN35_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
CORPUS = ["hello world, the quick brown fox jumps over the lazy dog 12345",
          "Hello again: 7 lazy dogs and 1 quick fox; the end."] * 40


def make_tokenizer(path, style, vocab_size):
    """A byte-level BPE tokenizer.json: 'smollm' (digits, then GPT-2 byte level) or 'qwen35'."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, Regex
    tok = Tokenizer(models.BPE())
    if style == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN35_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tr = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, tr)
    tok.add_tokens(["<custom tok>", "<|tool|>"])  # a user-defined one and a special-looking one
    tok.save(path)
    j = json.load(open(path))
    j["model"]["merges"].append(["x y", "z"])  # a space inside a merge part
    json.dump(j, open(path, "w"))
    return j


def expected_vocab(j, n_vocab):
    tokens = [None] * n_vocab
    types = [1] * n_vocab
    for t, i in j["model"]["vocab"].items():
        tokens[i] = t
    for a in j["added_tokens"]:
        c = a["content"]
        tokens[a["id"]] = c
        looks = c.startswith("<|") and c.endswith("|>")
        types[a["id"]] = 3 if (a["special"] or looks) else 4
    for i in range(n_vocab):
        if tokens[i] is None:
            tokens[i], types[i] = f"[PAD{i}]", 5
    merges = [m if isinstance(m, str) else " ".join(p.replace(" ", "\u0120") for p in m)
              for m in j["model"]["merges"]]
    return tokens, types, merges


def check_vocab(label, r, j, n_vocab, pre, ids):
    tokens, types, merges = expected_vocab(j, n_vocab)
    check(field(r, "tokenizer.ggml.model") == "gpt2", f"{label}: tokenizer model")
    check(field(r, "tokenizer.ggml.pre") == pre, f"{label}: pre is {field(r, 'tokenizer.ggml.pre')!r}, want {pre!r}")
    check(field(r, "tokenizer.ggml.tokens") == tokens, f"{label}: token list differs")
    check(field(r, "tokenizer.ggml.token_type") == types, f"{label}: token types differ")
    check(field_type(r, "tokenizer.ggml.token_type") == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32],
          f"{label}: token_type is not an i32 array")
    check(field(r, "tokenizer.ggml.merges") == merges, f"{label}: merges differ")
    for k, v in ids.items():
        check(field(r, k) == v, f"{label}: {k} = {field(r, k)!r}, want {v!r}")


# ---------------------------------------------------------------- the cases


def qwen35_keys(cfg, outtype, tokenizer_keys=()):
    a = "qwen35."
    want = {
        "general.architecture": "qwen35", "general.type": "model", "general.name": None,
        a + "block_count": cfg["num_hidden_layers"], a + "context_length": cfg["max_position_embeddings"],
        a + "embedding_length": cfg["hidden_size"], a + "feed_forward_length": cfg["intermediate_size"],
        a + "attention.head_count": cfg["num_attention_heads"],
        a + "attention.head_count_kv": cfg["num_key_value_heads"],
        a + "rope.freq_base": float(cfg["rope_parameters"]["rope_theta"]),
        a + "attention.layer_norm_rms_epsilon": float(np.float32(cfg["rms_norm_eps"])),
        a + "attention.key_length": cfg["head_dim"], a + "attention.value_length": cfg["head_dim"],
        "general.file_type": FILE_TYPES[outtype],
        a + "ssm.conv_kernel": cfg["linear_conv_kernel_dim"], a + "ssm.state_size": cfg["linear_key_head_dim"],
        a + "ssm.group_count": cfg["linear_num_key_heads"], a + "ssm.time_step_rank": cfg["linear_num_value_heads"],
        a + "ssm.inner_size": cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"],
        a + "full_attention_interval": 4,
        a + "rope.dimension_count": int(cfg["head_dim"] * cfg["partial_rotary_factor"]),
        a + "rope.dimension_sections": [11, 11, 10, 0],
        "general.quantization_version": 2,
    }
    for k in tokenizer_keys:
        want[k] = None
    if not tokenizer_keys:  # no tokenizer.json: llama.cpp's vocabulary-less keys
        want["tokenizer.ggml.model"] = "none"
        want[a + "vocab_size"] = cfg["vocab_size"]
    return want


def test_qwen35_golden():
    src = os.path.join(GOLDEN, "qwen35-tiny-a")
    if not os.path.isdir(src):
        check(False, f"missing reference folder {src}")
        return
    cfg = json.load(open(os.path.join(src, "config.json")))
    check(cfg["linear_num_value_heads"] > cfg["linear_num_key_heads"], "golden exercises the v-head reorder")
    expected = expected_qwen35(load_file(os.path.join(src, "model.safetensors")), cfg)
    for outtype in OUTTYPES:
        r = convert_and_read("qwen35", src, outtype)
        if r is None:
            continue
        label = f"qwen35/{outtype}"
        check_tensors(label, r, expected, outtype)
        check_keys(label, r, qwen35_keys(cfg, outtype))
        check_u32(label, r, [k for k in r.fields if k.startswith("qwen35.") and "freq" not in k
                             and "epsilon" not in k and "sections" not in k])
        check("output.weight" not in [t.name for t in r.tensors], f"{label}: tied model has output.weight")

    # the same weights with a tokenizer beside them (links to the golden files, which stay as they are)
    d = os.path.join(TMP, "qwen35-tok")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for f in ("config.json", "model.safetensors"):
        os.symlink(os.path.join(os.path.abspath(src), f), os.path.join(d, f))
    j = make_tokenizer(os.path.join(d, "tokenizer.json"), "qwen35", 300)
    template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    json.dump({"eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"},
               "chat_template": template, "add_bos_token": False}, open(os.path.join(d, "tokenizer_config.json"), "w"))
    r = convert_and_read("qwen35-tok", d, "f16")
    if r is not None:
        check_vocab("qwen35-tok", r, j, cfg["vocab_size"], "qwen35",
                    {"tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.padding_token_id": 0,
                     "tokenizer.chat_template": template, "tokenizer.ggml.add_bos_token": False})
        check_keys("qwen35-tok", r, qwen35_keys(cfg, "f16", [
            "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
            "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
            "tokenizer.ggml.add_bos_token", "tokenizer.chat_template"]))
        check_tensors("qwen35-tok", r, expected, "f16")


def test_qwen2_golden():
    src = os.path.join(GOLDEN, "qwen2-tiny-a")
    if not os.path.isdir(src):
        check(False, f"missing reference folder {src}")
        return
    cfg = json.load(open(os.path.join(src, "config.json")))
    expected = expected_dense(load_file(os.path.join(src, "model.safetensors")), cfg, llama=False)
    check(any(n.endswith("attn_q.bias") for n in expected), "golden qwen2 has q biases")
    a = "qwen2."
    for outtype in OUTTYPES:
        r = convert_and_read("qwen2", src, outtype)
        if r is None:
            continue
        label = f"qwen2/{outtype}"
        check_tensors(label, r, expected, outtype)
        check_keys(label, r, {
            "general.architecture": "qwen2", "general.type": "model", "general.name": "qwen2-tiny-a",
            a + "block_count": 3, a + "context_length": 4096, a + "embedding_length": 64,
            a + "feed_forward_length": 160, a + "attention.head_count": 4, a + "attention.head_count_kv": 2,
            a + "rope.freq_base": 1e6, a + "attention.layer_norm_rms_epsilon": float(np.float32(1e-6)),
            "general.file_type": FILE_TYPES[outtype], "general.quantization_version": 2,
            "tokenizer.ggml.model": "none", a + "vocab_size": cfg["vocab_size"]})
        check_u32(label, r, [a + "vocab_size"])


def make_llama(d, sharded):
    """A SmolLM2-shaped checkpoint: LlamaForCausalLM, GQA, tied embeddings, a 49152-free vocab."""
    rng = np.random.default_rng(7)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
           "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_hidden_layers": 2, "vocab_size": 320, "max_position_embeddings": 2048,
           "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True,
           "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}
    hd = 64 // 4
    shapes = {"model.embed_tokens.weight": (320, 64), "model.norm.weight": (64,)}
    for b in range(2):
        p = f"model.layers.{b}."
        shapes.update({p + "input_layernorm.weight": (64,), p + "post_attention_layernorm.weight": (64,),
                       p + "self_attn.q_proj.weight": (4 * hd, 64), p + "self_attn.k_proj.weight": (2 * hd, 64),
                       p + "self_attn.v_proj.weight": (2 * hd, 64), p + "self_attn.o_proj.weight": (64, 4 * hd),
                       p + "mlp.gate_proj.weight": (96, 64), p + "mlp.up_proj.weight": (96, 64),
                       p + "mlp.down_proj.weight": (64, 96)})
    hf = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    os.makedirs(d)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    if not sharded:
        save_file(hf, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    else:
        # shard 1 in BF16 (the values are rounded first so the expectation is exact), shard 2 F16+F32
        names = sorted(hf)
        s1, s2 = names[: len(names) // 2], names[len(names) // 2:]
        t1 = {}
        for n in s1:
            bits = f32_to_bf16_bits(hf[n])
            hf[n] = bf16_bits_to_f32(bits)
            t1[n] = ("BF16", hf[n].shape, bits.tobytes())
        write_safetensors(os.path.join(d, "model-00001-of-00002.safetensors"), t1)
        t2 = {}
        for i, n in enumerate(s2):
            if i % 2:
                hf[n] = hf[n].astype(np.float16).astype(np.float32)
                t2[n] = hf[n].astype(np.float16)
            else:
                t2[n] = hf[n]
        save_file(t2, os.path.join(d, "model-00002-of-00002.safetensors"))
        wm = {n: "model-00001-of-00002.safetensors" for n in s1}
        wm.update({n: "model-00002-of-00002.safetensors" for n in s2})
        json.dump({"metadata": {}, "weight_map": wm}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    return cfg, hf


def test_llama():
    for sharded in (False, True):
        d = os.path.join(TMP, "smollm2-sharded" if sharded else "smollm2")
        shutil.rmtree(d, ignore_errors=True)
        cfg, hf = make_llama(d, sharded)
        j = make_tokenizer(os.path.join(d, "tokenizer.json"), "smollm", 300)
        template = "{% for m in messages %}{{ m.content }}{% endfor %}"
        json.dump({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
                   "add_prefix_space": False, "chat_template": template},
                  open(os.path.join(d, "tokenizer_config.json"), "w"))
        expected = expected_dense(hf, cfg, llama=True)
        a = "llama."
        for outtype in (OUTTYPES if not sharded else ["f32", "q8_0"]):
            label = f"llama{'-sharded' if sharded else ''}/{outtype}"
            r = convert_and_read(os.path.basename(d), d, outtype)
            if r is None:
                continue
            check_tensors(label, r, expected, outtype)
            check_vocab(label, r, j, 320, "smollm",
                        {"tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                         "tokenizer.ggml.unknown_token_id": 0, "tokenizer.chat_template": template,
                         "tokenizer.ggml.add_space_prefix": False})
            check_keys(label, r, {
                "general.architecture": "llama", "general.type": "model", "general.name": None,
                a + "block_count": 2, a + "context_length": 2048, a + "embedding_length": 64,
                a + "feed_forward_length": 96, a + "attention.head_count": 4, a + "attention.head_count_kv": 2,
                a + "rope.freq_base": 100000.0, a + "attention.layer_norm_rms_epsilon": float(np.float32(1e-5)),
                "general.file_type": FILE_TYPES[outtype], a + "vocab_size": 320, a + "rope.dimension_count": 16,
                "tokenizer.ggml.add_space_prefix": False, "tokenizer.ggml.model": None,
                "tokenizer.ggml.pre": None, "tokenizer.ggml.tokens": None, "tokenizer.ggml.token_type": None,
                "tokenizer.ggml.merges": None, "tokenizer.ggml.bos_token_id": None,
                "tokenizer.ggml.eos_token_id": None, "tokenizer.ggml.unknown_token_id": None,
                "tokenizer.chat_template": None, "general.quantization_version": 2})
            check(field(r, "general.name") == os.path.basename(d), f"{label}: general.name")


def test_failures():
    """A refused conversion names the reason and leaves the output path as it was."""
    src = os.path.join(GOLDEN, "qwen2-tiny-a")
    if not os.path.isdir(src):
        return
    cases = {}
    # an architecture lathe does not convert
    d = os.path.join(TMP, "bad-arch")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    shutil.copy(os.path.join(src, "model.safetensors"), d)
    cases[d] = "GPTNeoXForCausalLM"
    # a tensor with no GGUF name
    d = os.path.join(TMP, "bad-tensor")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    shutil.copy(os.path.join(src, "config.json"), d)
    t = load_file(os.path.join(src, "model.safetensors"))
    t["model.layers.0.mystery.weight"] = np.zeros((2, 2), np.float32)
    save_file(t, os.path.join(d, "model.safetensors"))
    cases[d] = "model.layers.0.mystery.weight"
    # a truncated safetensors file
    d = os.path.join(TMP, "bad-file")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    shutil.copy(os.path.join(src, "config.json"), d)
    raw = open(os.path.join(src, "model.safetensors"), "rb").read()
    open(os.path.join(d, "model.safetensors"), "wb").write(raw[: len(raw) - 100])
    cases[d] = "model.safetensors"
    # a layer beyond the config's count
    d = os.path.join(TMP, "bad-layer")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["num_hidden_layers"] = 2
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    shutil.copy(os.path.join(src, "model.safetensors"), d)
    cases[d] = "layer 2"

    outdir = os.path.join(TMP, "failed-out")
    shutil.rmtree(outdir, ignore_errors=True)
    os.makedirs(outdir)
    out = os.path.join(outdir, "model.gguf")
    for d, needle in cases.items():
        with open(out, "w") as f:
            f.write("old contents")
        p = run_convert(d, out, "f16", expect_ok=False)
        name = os.path.basename(d)
        check(p.returncode != 0, f"{name}: convert succeeded")
        check(needle in p.stderr, f"{name}: stderr {p.stderr.strip()!r} lacks {needle!r}")
        check(open(out).read() == "old contents", f"{name}: the old output was touched")
        check(os.listdir(outdir) == ["model.gguf"], f"{name}: files left behind: {os.listdir(outdir)}")
        os.remove(out)
        p = run_convert(d, out, "f16", expect_ok=False)
        check(os.listdir(outdir) == [], f"{name}: a failed convert left {os.listdir(outdir)}")

    # usage errors
    p = subprocess.run([LATHE, "convert", src], capture_output=True, text=True)
    check(p.returncode == 2, "convert without -o must be a usage error")
    p = subprocess.run([LATHE, "convert", src, "-o", out, "--outtype", "q4_7"], capture_output=True, text=True)
    check(p.returncode == 2 and "q4_7" in p.stderr, "an unknown --outtype must be refused by name")


def main():
    if not LATHE or not os.path.exists(LATHE):
        print("LATHE_BIN not set; skipped")
        return 77
    os.makedirs(TMP, exist_ok=True)
    test_qwen35_golden()
    test_qwen2_golden()
    try:
        import tokenizers  # noqa: F401
        test_llama()
    except ImportError:
        print("tokenizers missing; llama case skipped")
    test_failures()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
