"""bench_train_hf.py: the HF transformers peer of bench/bench_train.sh: training tokens/s and
peak GPU memory of transformers' own model code, eager, on one GPU.

The model is loaded from an HF checkpoint directory in F32 (the master weights), attention
"eager" (Qwen3.5's DeltaNet layers use transformers' torch fallback when flash-linear-attention
and causal-conv1d are missing, which is what "HF eager" means here), and trained with
torch.autocast(bfloat16) mixed precision and torch.optim.AdamW (fused):
  --mode full   every parameter, lr 1e-5
  --mode lora   peft LoRA r 16, alpha 32, lr 1e-4, on every nn.Linear inside the decoder
                layers (lm_head excluded), or on those whose last name part is in --targets
Batches are random token ids in [0, vocab) of shape [seqs, len], labels = input_ids. After
--warmup steps, --steps steps are timed (torch.cuda.synchronize around them). The last
stdout line is one JSON object:
  {"mode","seqs","len","tokens_per_s","peak_gib","loss", ...}
peak_gib is torch.cuda.max_memory_allocated / 2^30 (tensors only, no CUDA context or cached
blocks). On a CUDA out-of-memory error tokens_per_s is null and "error" is "OOM".

Usage (from the repository root, on the GPU machine):
  python3 bench/bench_train_hf.py --model /tmp/h200w/qwen35-0.8b --seqs 16 --len 512 \\
      --mode lora --steps 3 --warmup 1
Exits 77 without torch or CUDA."""
import argparse
import json
import logging
import sys
import time
import warnings


class Counter(logging.Handler):
    """Counts transformers' warnings (the DeltaNet fast-path notice among them)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="HF checkpoint directory")
    ap.add_argument("--seqs", type=int, default=1)
    ap.add_argument("--len", type=int, default=512)
    ap.add_argument("--mode", choices=["full", "lora"], default="lora")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--lr", type=float, default=None, help="default 1e-5 full, 1e-4 LoRA")
    ap.add_argument("--targets", default="all",
                    help="LoRA: comma-separated last name parts (q_proj,...) or 'all'")
    a = ap.parse_args()

    try:
        import torch
    except ImportError:
        print("skipped: no torch")
        sys.exit(77)
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        sys.exit(77)
    import transformers
    from transformers import AutoModelForCausalLM

    counter = Counter()
    logging.getLogger("transformers").addHandler(counter)
    py_warnings = []
    warnings.simplefilter("default")  # each warning once per place it is raised from
    warnings.showwarning = lambda msg, cat, *rest, **kw: py_warnings.append(
        f"{cat.__name__}: {msg}")

    result = {"mode": a.mode, "seqs": a.seqs, "len": a.len, "tokens_per_s": None,
              "peak_gib": None, "loss": None, "steps": a.steps, "warmup": a.warmup}
    dev = torch.device("cuda")
    t_load = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(a.model, attn_implementation="eager",
                                                 dtype=torch.float32)
    model.float().to(dev)
    model.config.use_cache = False
    lr = a.lr if a.lr is not None else (1e-5 if a.mode == "full" else 1e-4)

    if a.mode == "lora":
        from peft import LoraConfig, get_peft_model
        linears = [n for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and ".layers." in n]
        every = sorted({n.rsplit(".", 1)[-1] for n in linears})
        want = every if a.targets == "all" else [t for t in a.targets.split(",") if t]
        missing = [t for t in want if t not in every]
        if missing:
            sys.exit(f"bench_train_hf: no decoder nn.Linear named {missing} (there are {every})")
        chosen = [n for n in linears if n.rsplit(".", 1)[-1] in want]
        print(f"decoder nn.Linear name parts: {', '.join(every)}", file=sys.stderr)
        print(f"LoRA targets ({len(chosen)} modules): {', '.join(want)}; left out: "
              f"{', '.join(t for t in every if t not in want) or 'none'}", file=sys.stderr)
        cfg = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, bias="none",
                         target_modules=chosen, task_type="CAUSAL_LM")
        model = get_peft_model(model, cfg)
        result["lora_targets"] = want
        result["lora_modules"] = len(chosen)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    result["trainable"] = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=lr, fused=True)
    vocab = model.config.vocab_size
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}; loaded in {time.perf_counter() - t_load:.1f} s; "
          f"{result['trainable']} trainable numbers; vocab {vocab}", file=sys.stderr)

    gen = torch.Generator(device=dev).manual_seed(1)
    batches = [torch.randint(0, vocab, (a.seqs, a.len), device=dev, generator=gen)
               for _ in range(a.warmup + a.steps)]

    def step(ids):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.detach()

    rc = 0
    try:
        for i in range(a.warmup):
            step(batches[i])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        losses = [step(batches[a.warmup + i]) for i in range(a.steps)]
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        result["seconds"] = round(dt, 4)
        result["tokens_per_s"] = round(a.steps * a.seqs * a.len / dt, 1) if a.steps else None
        result["loss"] = round(losses[-1].item(), 4) if losses else None
    except torch.cuda.OutOfMemoryError:
        result["error"] = "OOM"
        rc = 1
    result["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    result["warnings"] = len(counter.messages) + len(py_warnings)
    for m in dict.fromkeys(counter.messages + py_warnings):
        print(f"warning: {m[:200]}", file=sys.stderr)
    sys.stderr.flush()
    print(json.dumps(result), flush=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
