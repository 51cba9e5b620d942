#!/usr/bin/env python3
"""hf_reference.py: reference data from Hugging Face transformers' own model code, the
independent implementation lathe's model code is checked against (tests/data/golden/README.md).

Needs torch, transformers and safetensors (not lathe's test requirements: run it on a machine
that has them; the H200 test machine has transformers 5.17, with Qwen3_5ForCausalLM,
Qwen2ForCausalLM and LlamaForCausalLM). Everything is computed in float32 on the CPU, so
the results do not depend on the GPU.

  tools/hf_reference.py make CONFIG.json OUTDIR [--batch B] [--seqlen T] [--seed S]
      A model with random weights from a config (model_type qwen3_5_text, qwen2 or llama;
      an "architectures" key is ignored, so an existing case's config.json will do), saved as
      an HF checkpoint (config.json, generation_config.json, model.safetensors), plus
      reference.safetensors with: input_ids (int32 [B,T]), logits (f32 [B,T,V]),
      loss (f32 [1], mean next-token cross-entropy, labels = input_ids shifted inside HF),
      grad.<hf parameter name> (f32) for every parameter, greedy_prompt / greedy_ids
      (int32, 12 greedy tokens after the first 8 tokens of row 0); and reference.json,
      the loss, greedy ids and the arguments in text. Defaults: B 2, T 24, seed 11.
  tools/hf_reference.py hidden HF_DIR OUT.safetensors [--seqlen T] [--seed S]
      Every layer's hidden state (hidden.<i>, f32 [1,T,C]) for random ids, to find the
      first layer where an implementation departs from the reference.

A new case for the tests goes in tests/data/golden/<name>/ (see the README there).
"""
import argparse, json, os
import torch

torch.backends.cuda.matmul.allow_tf32 = False

def build(cfg_dict):
    mt = cfg_dict.get("model_type")
    if mt in ("qwen3_5_text", "qwen3_5"):
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM
        return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**cfg_dict))
    if mt == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM
        return Qwen2ForCausalLM(Qwen2Config(**cfg_dict))
    if mt == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        return LlamaForCausalLM(LlamaConfig(**cfg_dict))
    raise SystemExit(f"unknown model_type {mt!r}")

def randomise(model, seed):
    # HF starts (1+w) norms at zero and gated norms at one; random values make a converter
    # that forgets a transform fail loudly.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
            if n.endswith(("A_log", "dt_bias")) or n.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)

def make(a):
    from safetensors.torch import save_file
    cfg = json.load(open(a.config))
    cfg.pop("architectures", None)
    torch.manual_seed(a.seed)
    model = build(cfg).float()
    randomise(model, a.seed)
    os.makedirs(a.outdir, exist_ok=True)
    model.save_pretrained(a.outdir, safe_serialization=True)
    ids = torch.randint(0, model.config.vocab_size, (a.batch, a.seqlen),
                        generator=torch.Generator().manual_seed(a.seed + 1))
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    ref = {"input_ids": ids.to(torch.int32), "logits": out.logits.detach().float(),
           "loss": out.loss.detach().float().reshape(1)}
    ref.update({"grad." + n: p.grad.detach().float() for n, p in model.named_parameters()
                if p.grad is not None})
    with torch.no_grad():
        prompt = ids[:1, :8]
        gen = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0,
                             eos_token_id=None)
    ref["greedy_prompt"] = prompt.to(torch.int32)
    ref["greedy_ids"] = gen[:, 8:].to(torch.int32)
    save_file({k: v.contiguous() for k, v in ref.items()},
              os.path.join(a.outdir, "reference.safetensors"))
    summary = {"loss": out.loss.item(), "batch": a.batch, "seqlen": a.seqlen, "seed": a.seed,
               "labels": "input_ids (HF shifts them inside: mean cross-entropy of token t+1 given <=t)",
               "greedy_ids": gen[0, 8:].tolist()}
    with open(os.path.join(a.outdir, "reference.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({"loss": summary["loss"], "greedy_ids": summary["greedy_ids"]}))

def hidden(a):
    from safetensors.torch import save_file
    from transformers import AutoConfig
    cfg = AutoConfig.from_pretrained(a.hf_dir)
    model = build(cfg.to_dict())
    from safetensors.torch import load_file
    model.load_state_dict(load_file(os.path.join(a.hf_dir, "model.safetensors")), strict=False)
    model.float().eval()
    ids = torch.randint(0, cfg.vocab_size, (1, a.seqlen),
                        generator=torch.Generator().manual_seed(a.seed))
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    t = {"input_ids": ids.to(torch.int32), "logits": out.logits.float()}
    t.update({f"hidden.{i}": h.float().contiguous() for i, h in enumerate(out.hidden_states)})
    save_file(t, a.out)

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    sp = p.add_subparsers(dest="cmd", required=True)
    m = sp.add_parser("make"); m.add_argument("config"); m.add_argument("outdir")
    m.add_argument("--batch", type=int, default=2); m.add_argument("--seqlen", type=int, default=24)
    m.add_argument("--seed", type=int, default=11)
    h = sp.add_parser("hidden"); h.add_argument("hf_dir"); h.add_argument("out")
    h.add_argument("--seqlen", type=int, default=24); h.add_argument("--seed", type=int, default=5)
    a = p.parse_args()
    make(a) if a.cmd == "make" else hidden(a)
