#!/usr/bin/env python3
"""serve_h200.py: issue 8's GPU items against a real `lathe serve --backend cuda`, with
`requests` alone (the H200 image has no `openai` package).

  serve_h200.py LATHE MODEL.gguf [--text FILE | --reps N] [--seconds S]

1. Serving alone: one client streams greedy chat completions for S seconds; the gaps
   between streamed chunks give per-token latency (p50, p95) and tokens/s.
2. Training beside serving: POST /train (a LoRA job on a plain-text file) while the same
   client streams; latency again; the job must end "done" with a falling loss.
3. The refusal scenario: the server restarted with LATHE_CUDA_DISABLE_OPS=SQR; a
   device_only job comes back from GET /train as "error" with the admission's sentence
   (naming SQR, the node and k_conv); a chat completion still answers afterwards.
/health is polled every 50 ms throughout and must never fail once ready. Prints a summary
and exits 1 on any failed check. LATHE_SERVE_BACKEND=cpu runs it without a GPU (a smoke test of
the script; the refusal step then fails, as nothing refuses).
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import requests

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    def __init__(self, lathe, model, train_dir, env_extra=None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(train_dir, f"serve-{self.port}.log"), "w+")
        env = dict(os.environ, **(env_extra or {}))
        self.proc = subprocess.Popen(
            [lathe, "serve", "-m", model, "--backend", os.environ.get("LATHE_SERVE_BACKEND", "cuda"),
             "--host", "127.0.0.1", "--port",
             str(self.port), "--parallel", "4", "--ctx", "2048", "--train-dir", train_dir],
            stdout=self.log, stderr=self.log, env=env)
        t0 = time.time()
        while time.time() - t0 < 300:
            if self.proc.poll() is not None:
                raise RuntimeError("lathe serve exited:\n" + self.tail())
            try:
                if requests.get(self.base + "/health", timeout=5).status_code == 200:
                    self.ready_s = time.time() - t0
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        raise RuntimeError("lathe serve did not become ready:\n" + self.tail())

    def tail(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-3000:]

    def stop(self):
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def get(self, path):
        return requests.get(self.base + path, timeout=120)

    def post(self, path, body=None):
        return requests.post(self.base + path, json=body, timeout=120)


class Health(threading.Thread):
    def __init__(self, base):
        super().__init__(daemon=True)
        self.base, self.stop_flag = base, threading.Event()
        self.n_ok, self.bad, self.slowest = 0, [], 0.0

    def run(self):
        while not self.stop_flag.is_set():
            t0 = time.time()
            try:
                r = requests.get(self.base + "/health", timeout=10)
                if r.status_code == 200 and r.json().get("status") == "ok":
                    self.n_ok += 1
                else:
                    self.bad.append(f"{r.status_code} {r.text[:80]}")
            except requests.RequestException as e:
                self.bad.append(repr(e)[:120])
            self.slowest = max(self.slowest, time.time() - t0)
            time.sleep(0.05)


class Streamer(threading.Thread):
    """Streams greedy chat completions back to back; records the gaps between chunks."""

    def __init__(self, base):
        super().__init__(daemon=True)
        self.base, self.stop_flag = base, threading.Event()
        self.gaps, self.errors, self.n_requests, self.n_tokens = [], [], 0, 0

    def run(self):
        body = {"messages": [{"role": "user", "content": "Tell me a long story."}],
                "temperature": 0, "max_tokens": 64, "stream": True}
        while not self.stop_flag.is_set():
            try:
                with requests.post(self.base + "/v1/chat/completions", json=body, stream=True,
                                   timeout=120) as r:
                    if r.status_code != 200:
                        self.errors.append(f"{r.status_code} {r.text[:200]}")
                        time.sleep(0.5)
                        continue
                    last = None
                    for line in r.iter_lines():
                        if not line.startswith(b"data: ") or line == b"data: [DONE]":
                            continue
                        ev = json.loads(line[6:])
                        if not ev.get("choices") or not ev["choices"][0]["delta"].get("content"):
                            continue
                        now = time.time()
                        if last is not None:
                            self.gaps.append(now - last)
                        last = now
                        self.n_tokens += 1
                self.n_requests += 1
            except requests.RequestException as e:
                self.errors.append(repr(e)[:200])

    def finish(self):
        self.stop_flag.set()
        self.join(timeout=120)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1)))] if xs else float("nan")


def latency(name, s):
    p50, p95 = pct(s.gaps, 0.5), pct(s.gaps, 0.95)
    tps = len(s.gaps) / sum(s.gaps) if s.gaps else 0.0
    line = (f"{name}: p50 {p50 * 1e3:.2f} ms, p95 {p95 * 1e3:.2f} ms, {tps:.1f} tokens/s "
            f"({len(s.gaps)} gaps, {s.n_requests} requests)")
    print(line, flush=True)
    return line


def wait_train(srv, states, timeout):
    t0 = time.time()
    while time.time() - t0 < timeout:
        j = srv.get("/train").json()
        if j["state"] in states:
            return j
        time.sleep(0.25)
    return srv.get("/train").json()


def answers(srv):
    r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                          "max_tokens": 8, "temperature": 0})
    return r.status_code == 200


def serve(lathe, model, train_dir, env_extra, steps, min_polls):
    """Starts `lathe serve`, polls /health while steps(srv) runs, stops it with SIGTERM;
    checks /health never failed and the exit status. Returns a line on /health."""
    srv = Server(lathe, model, train_dir, env_extra)
    health = Health(srv.base)
    health.start()
    try:
        steps(srv)
    except Exception as e:  # noqa: BLE001 - report, then stop the server
        check(False, f"exception {e!r}\n{srv.tail()}")
    finally:
        health.stop_flag.set()
        health.join()
        rc = srv.stop()
    line = (f"/health {health.n_ok} polls, {len(health.bad)} failures {health.bad[:3]}, slowest "
            f"{health.slowest * 1e3:.0f} ms (model ready in {srv.ready_s:.1f} s)")
    check(health.n_ok > min_polls and not health.bad, line)
    check(rc == 0, f"SIGTERM exit status {rc}")
    return line


def main():
    lathe, model = sys.argv[1], sys.argv[2]
    seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 10
    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 400
    text = ("The lathe turns the wood while the chisel shapes it. " * reps).strip()
    if "--text" in sys.argv:
        text = open(sys.argv[sys.argv.index("--text") + 1]).read()
    summary = []
    with tempfile.TemporaryDirectory(prefix="serve_h200_") as d:
        def alongside(srv):
            idle = Streamer(srv.base)
            idle.start()
            time.sleep(seconds)
            idle.finish()
            check(not idle.errors and len(idle.gaps) > 20, f"idle streaming {idle.errors[:2]}")
            summary.append(latency("serving alone", idle))

            r = srv.post("/train", {"out": "job.gguf", "text": text, "window": 256, "epochs": 2,
                                    "rank": 16, "lr": 1e-3})
            check(r.status_code == 200, f"/train accepted: {r.text[:300]}")
            busy = Streamer(srv.base)
            busy.start()
            t0 = time.time()
            j = wait_train(srv, ("done", "error", "cancelled"), 400)
            busy.finish()
            check(not busy.errors, f"streaming during training {busy.errors[:2]}")
            check(j["state"] == "done", f"job done: {json.dumps(j)[:600]}")
            losses = [e["train_loss"] for e in j.get("epochs", [])]
            check(len(losses) == 2 and losses[-1] < losses[0], f"loss falls {losses}")
            summary.append(latency("during training", busy))
            prog = j.get("progress", {})
            summary.append(f"train job: {time.time() - t0:.1f} s, losses {losses}, "
                           f"{prog.get('tokens_per_s', 0):.0f} tokens/s, peak "
                           f"{j.get('memory', {}).get('peak_bytes', 0) / 2**20:.0f} MiB, yielded "
                           f"{j.get('yielded_s', 0):.1f} s")
            check(os.path.exists(os.path.join(d, "job.gguf")), "adapter written")
            r = srv.post("/lora-adapters/load", {"name": "job.gguf"})
            check(r.status_code == 200, f"adapter loaded: {r.text[:200]}")
            check(answers(srv), "answers with the adapter")

        def refusal(srv):
            # f32_products: the F32 path's L2-norm backward is the k_conv scenario's chain
            # (SQR of k_conv's copy); a BF16 step's is one L2_NORM_BACK node, no SQR
            r = srv.post("/train", {"out": "refused.gguf", "text": text[:4000], "window": 128,
                                    "device_only": True, "f32_products": True})
            check(r.status_code == 200, f"/train takes the job: {r.text[:300]}")
            j = wait_train(srv, ("done", "error", "cancelled"), 120)
            err = j.get("error") or ""
            check(j["state"] == "error" and "SQR" in err and "k_conv" in err,
                  f"refused naming SQR and k_conv: {err[:400]}")
            summary.append(f"refusal via GET /train: state {j['state']}: {err[:300]}")
            check(not os.path.exists(os.path.join(d, "refused.gguf")), "nothing written")
            check(answers(srv), "serving continues after the refusal")

        summary.append(serve(lathe, model, d, None, alongside, 20))
        serve(lathe, model, d, {"LATHE_CUDA_DISABLE_OPS": "SQR"}, refusal, 5)
    print("==== serve summary")
    for s in summary:
        print(s)
    print(f"{len(failures)} failed checks")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
