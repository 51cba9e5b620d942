#!/usr/bin/env python3
"""bench_serve.py: batched decode through `lathe serve`, as clients see it.

  bench_serve.py LATHE MODEL.gguf [--streams 1,4,16,64] [--tokens 128] [--backend cuda]
                 [--server-log DIR]

For each number of streams N: a server with --parallel N (so all N decode in one batch)
starts, warms up with one request, then N clients each stream one completion of --tokens
tokens (`ignore_eos`, a fixed prompt, greedy) at the same moment. Reported per N:
aggregate tokens/s (all streamed tokens over the wall time from the first request to the
last token), and p50 / p95 of the time between a stream's consecutive tokens over all
streams (the first token of each stream, which waits for the prompt, is left out; tokens
are counted by the stream's usage, since a token inside a UTF-8 character streams no text). A
markdown table last, with the ratio of each aggregate to one stream's, and where a decode
step's time went by the server's own counters (/metrics): the model (the batched forward,
logits copied to the host) and the sampling after it (sampling, detokenizing, stops,
streaming).

Each server's stdout and stderr go to DIR/serve_N.log with --server-log (kept: a server run
under LATHE_CUDA_PROFILE prints its table there when SIGTERM stops it, as every server here is
stopped), else to a temporary file, shown in part when the server fails.

`requests` alone (the H200 image has no `openai` package). Exits 1 when a request fails.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import requests

PROMPT = "Write a long story about a lighthouse keeper who finds a map."


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(lathe, model, backend, parallel, log, extra=()):
    """`lathe serve` on a free port (extra: more options); (process, base URL) once ready."""
    port = free_port()
    proc = subprocess.Popen([lathe, "serve", "-m", model, "--backend", backend, "--host",
                             "127.0.0.1", "--port", str(port), "--parallel", str(parallel),
                             "--ctx", "1024", "--quiet", *extra], stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    t0 = time.time()
    while time.time() - t0 < 300:
        if proc.poll() is not None:
            raise RuntimeError(f"lathe serve exited (rc {proc.returncode})")
        try:
            if requests.get(base + "/health", timeout=5).status_code == 200:
                return proc, base
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("lathe serve did not become ready")


def stream(base, n_tokens, out, go):
    """One streamed completion; out gets the token times and the error, if any."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": n_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    go.wait()
    times = []
    try:
        with requests.post(base + "/v1/chat/completions", json=body, stream=True,
                           timeout=600) as r:
            if r.status_code != 200:
                out["error"] = f"{r.status_code} {r.text[:200]}"
                return
            for line in r.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    out["generated"] = chunk["usage"].get("completion_tokens")
                delta = chunk["choices"][0].get("delta", {}) if chunk.get("choices") else {}
                if delta.get("content"):
                    times.append(time.perf_counter())
    except requests.RequestException as e:
        out["error"] = repr(e)[:200]
    out["times"] = times


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run(lathe, model, backend, n, n_tokens, log):
    proc, base = start(lathe, model, backend, n, log)
    try:
        warm = {}
        stream(base, 8, warm, _set_event())
        outs = [{} for _ in range(n)]
        before = metrics(base)
        go = threading.Event()
        threads = [threading.Thread(target=stream, args=(base, n_tokens, outs[i], go))
                   for i in range(n)]
        for t in threads:
            t.start()
        t0 = time.perf_counter()
        go.set()
        for t in threads:
            t.join()
        errors = [o["error"] for o in outs if "error" in o]
        ends = [o["times"][-1] for o in outs if o.get("times")]
        # tokens as the server counts them (usage): a token that ends inside a UTF-8
        # character streams no text of its own, so content chunks can be fewer
        total = sum(o.get("generated") or len(o.get("times", [])) for o in outs)
        gaps = [b - a for o in outs for a, b in zip(o.get("times", [])[:-1], o.get("times", [])[1:])]
        wall = (max(ends) - t0) if ends else float("nan")
        step = step_costs(before, metrics(base))
        return {"streams": n, "tokens": total, "wall_s": wall, **step,
                "tokens_per_s": total / wall if ends else 0.0,
                "p50_ms": 1e3 * pct(gaps, 0.5), "p95_ms": 1e3 * pct(gaps, 0.95), "errors": errors}
    finally:
        # SIGTERM: the server shuts down in order (what LATHE_CUDA_PROFILE's table needs)
        proc.terminate()
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "killed after 60 s"
        if rc != 0:
            print(f"{n} streams: lathe serve did not exit cleanly on SIGTERM (rc {rc})",
                  file=sys.stderr)


def metrics(base):
    """/metrics' plain samples (name -> value; labelled ones left out)."""
    out = {}
    for line in requests.get(base + "/metrics", timeout=30).text.splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#") and "{" not in parts[0]:
            out[parts[0]] = float(parts[1])
    return out


def step_costs(m0, m1):
    """Where a decode step's time went, from the server's counters: the model (the batched
    forward, logits copied to the host) and what follows it (sampling, detokenizing, stops,
    streaming), in ms a step, and the mean batch."""
    d = {k: m1.get(k, 0.0) - m0.get(k, 0.0) for k in m1}
    steps = max(d.get("lathe_decode_steps_total", 0.0), 1.0)
    return {"steps": int(steps), "batch": d.get("lathe_decode_tokens_total", 0.0) / steps,
            "model_ms": 1e3 * d.get("lathe_decode_seconds_total", 0.0) / steps,
            "sample_ms": 1e3 * d.get("lathe_sample_seconds_total", 0.0) / steps}


def _set_event():
    e = threading.Event()
    e.set()
    return e


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lathe")
    ap.add_argument("model")
    ap.add_argument("--streams", default="1,4,16,64")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--backend", default=os.environ.get("LATHE_SERVE_BACKEND", "cuda"))
    ap.add_argument("--server-log", metavar="DIR",
                    help="write each server's stdout and stderr to DIR/serve_N.log")
    a = ap.parse_args()
    if a.server_log:
        os.makedirs(a.server_log, exist_ok=True)
    rows, failed = [], False
    with tempfile.TemporaryDirectory() as d:
        for n in [int(x) for x in a.streams.split(",")]:
            path = os.path.join(a.server_log or d, f"serve_{n}.log")
            with open(path, "w+") as log:
                try:
                    r = run(a.lathe, a.model, a.backend, n, a.tokens, log)
                except RuntimeError as e:
                    log.flush()
                    log.seek(0)
                    print(f"{n} streams: {e}\n{log.read()[-2000:]}", file=sys.stderr)
                    failed = True
                    continue
            rows.append(r)
            print(json.dumps(r), flush=True)
            if r["errors"] or r["tokens"] < n * a.tokens:
                print(f"{n} streams: {len(r['errors'])} failed, {r['tokens']} of "
                      f"{n * a.tokens} tokens: {r['errors'][:2]}", file=sys.stderr)
                failed = True
    base = rows[0]["tokens_per_s"] if rows and rows[0]["streams"] == 1 else None
    print(f"\n### lathe serve --parallel N --backend {a.backend}: N streams of {a.tokens} "
          f"tokens at once ({os.path.basename(a.model)})\n")
    print("| streams | aggregate tokens/s | x one stream | p50 per token ms | p95 per token ms "
          "| steps | mean batch | model ms a step | sampling ms a step |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        x = f"{r['tokens_per_s'] / base:.2f}" if base else "-"
        print(f"| {r['streams']} | {r['tokens_per_s']:.1f} | {x} | {r['p50_ms']:.1f} | "
              f"{r['p95_ms']:.1f} | {r['steps']} | {r['batch']:.1f} | {r['model_ms']:.2f} | "
              f"{r['sample_ms']:.2f} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
