#!/usr/bin/env python3
"""pacing_h200.py: issue 17's slowdown run as clients see it, on a device.

  pacing_h200.py LATHE MODEL.gguf [--clients 16] [--tokens 64] [--alone 12] [--ppm 100000]
                 [--reps 120] [--window 512] [--max-s 150] [--backend cuda]

One `lathe serve --parallel CLIENTS` (its /train beside it), three phases:
  1. serving alone: CLIENTS clients stream greedy chat completions of TOKENS tokens back to
     back for ALONE seconds;
  2. the job alone: a LoRA job (rank 16, all targets lathe adapts, WINDOW, one epoch over a
     text of REPS paragraphs) with no client: its tokens/s;
  3. both: the same job sent with max_slowdown_ppm PPM while the clients stream again, until
     it ends (or MAX_S seconds, then it is cancelled and its progress counts).
Reported: the clients' p50 / p95 time between streamed tokens and aggregate tokens/s alone
and during the job, the job's tokens/s alone and under load, its own pacing report (windows,
yielded time, mean and max slowdown of the overlapped requests). Exits 1 when a request fails
or a job does not start. The server and the clients are bench_serve.py's.
"""
import argparse
import os
import sys
import tempfile
import threading
import time

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from bench_serve import pct, start, stream  # noqa: E402

PARAGRAPH = ("The keeper climbed the spiral stair each evening, trimmed the wick and wound the "
             "clockwork that turned the lens, and wrote the weather in a book nobody read. ")


class Clients:
    """n threads streaming completions back to back; token times of every stream."""

    def __init__(self, base, n, n_tokens):
        self.base, self.n_tokens, self.stop = base, n_tokens, threading.Event()
        self.streams, self.errors, self.lock = [], [], threading.Lock()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(n)]

    def run(self):
        go = threading.Event()
        go.set()
        while not self.stop.is_set():
            out = {}
            stream(self.base, self.n_tokens, out, go)
            with self.lock:
                if "error" in out:
                    self.errors.append(out["error"])
                self.streams.append((out.get("times", []), out.get("generated") or 0))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=600)

    def window(self, t0, t1):
        """p50 / p95 gap (ms) and tokens/s over the tokens streamed in [t0, t1)."""
        with self.lock:
            streams = list(self.streams)
        gaps, n = [], 0
        for times, _ in streams:
            inside = [t for t in times if t0 <= t < t1]
            n += len(inside)
            gaps += [b - a for a, b in zip(inside[:-1], inside[1:])]
        return 1e3 * pct(gaps, 0.5), 1e3 * pct(gaps, 0.95), n / (t1 - t0)


TARGETS = "attn_q,attn_k,attn_v,attn_output,attn_qkv,attn_gate,ssm_out,ffn_gate,ffn_up,ffn_down"


def job_body(args, out, bound):
    b = {"text": PARAGRAPH * args.reps, "window": args.window, "epochs": 1, "rank": 16,
         "alpha": 32, "lr": 1e-4, "out": out, "val_split": 0,
         "targets": args.targets.split(",")}
    if bound:
        b["max_slowdown_ppm"] = bound
    return b


def run_job(base, body, max_s):
    """Sends the job and waits for it; (final GET /train, seconds, tokens/s)."""
    r = requests.post(base + "/train", json=body, timeout=60)
    if r.status_code != 200:
        raise RuntimeError(f"/train: {r.status_code} {r.text[:300]}")
    t0 = time.perf_counter()
    j = requests.get(base + "/train", timeout=30).json()
    while j.get("state") in ("starting", "running") and time.perf_counter() - t0 < max_s:
        time.sleep(0.5)
        j = requests.get(base + "/train", timeout=30).json()
    dt = time.perf_counter() - t0
    if j.get("state") in ("starting", "running"):
        requests.post(base + "/train/cancel", json={}, timeout=30)
    tokens = (j.get("progress") or {}).get("tokens") or 0
    return j, dt, tokens / dt if dt > 0 else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lathe")
    ap.add_argument("model")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--alone", type=float, default=12.0)
    ap.add_argument("--ppm", type=int, default=100000)
    ap.add_argument("--reps", type=int, default=120)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--max-s", type=float, default=150.0)
    ap.add_argument("--targets", default=TARGETS, help="LoRA targets, comma-separated")
    ap.add_argument("--backend", default=os.environ.get("LATHE_SERVE_BACKEND", "cuda"))
    args = ap.parse_args()
    failures = []
    with tempfile.TemporaryDirectory(prefix="lathe_pacing_") as tmp:
        log = open(os.path.join(tmp, "serve.log"), "w")
        proc, base = start(args.lathe, args.model, args.backend, args.clients, log,
                           ("--train-dir", tmp, "--train-yield-ms", "600000"))
        try:
            with Clients(base, args.clients, args.tokens) as cl:
                time.sleep(3.0)  # the batch fills
                t0 = time.perf_counter()
                time.sleep(args.alone)
                alone = cl.window(t0, time.perf_counter())
            solo, solo_s, solo_tps = run_job(base, job_body(args, "solo.gguf", 0),
                                             args.max_s)
            with Clients(base, args.clients, args.tokens) as cl2:
                time.sleep(3.0)
                t0 = time.perf_counter()
                both, both_s, both_tps = run_job(
                    base, job_body(args, "paced.gguf", args.ppm), args.max_s)
                during = cl2.window(t0, time.perf_counter())
            errors = cl.errors + cl2.errors
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except Exception:  # noqa: BLE001
                proc.kill()
            log.close()
    for name, j in (("the job alone", solo), ("the paced job", both)):
        if j.get("state") not in ("done", "cancelled"):
            failures.append(f"{name}: {j.get('state')}: {j.get('error')}")
    p = both.get("pacing") or {}
    hist = (p.get("slowdown") or {}).get("percent_histogram") or {}
    n_req = sum(hist.values())
    mean = sum(int(k) * v for k, v in hist.items()) / n_req if n_req else float("nan")
    print(f"### lathe serve --parallel {args.clients} --backend {args.backend} beside a LoRA "
          f"job (max_slowdown_ppm {args.ppm})\n")
    print("| phase | clients p50 ms | p95 ms | clients tokens/s | job | job tokens/s |")
    print("| --- | ---: | ---: | ---: | --- | ---: |")
    print(f"| serving alone | {alone[0]:.1f} | {alone[1]:.1f} | {alone[2]:.0f} | - | - |")
    print(f"| job alone | - | - | - | {solo.get('state')} in {solo_s:.0f} s | {solo_tps:.0f} |")
    print(f"| both | {during[0]:.1f} | {during[1]:.1f} | {during[2]:.0f} | "
          f"{both.get('state')} in {both_s:.0f} s | {both_tps:.0f} |")
    slow = 100 * (1 - during[2] / alone[2]) if alone[2] else float("nan")
    keep = 100 * both_tps / solo_tps if solo_tps else float("nan")
    print(f"\nclients {slow:.1f}% slower during the job (bound {args.ppm / 1e4:.0f}%); the job "
          f"kept {keep:.0f}% of its solo speed; its report: {p.get('windows')} windows "
          f"({p.get('windows_busy')} while serving was busy), yielded "
          f"{(p.get('yielded_ms') or 0) / 1e3:.1f} s, {n_req} overlapped requests, mean slowdown "
          f"{mean:.1f}%, max {((p.get('slowdown') or {}).get('max_ppm') or 0) / 1e4:.1f}%")
    if errors:
        failures.append(f"request errors: {errors[:3]}")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
