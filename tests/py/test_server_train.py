"""test_server_train.py: training beside serving, through `lathe serve` with the real
SmolLM2-135M-Instruct on the CPU, while a thread polls /health (never failing once ok).

  1. A job admission refuses (a 1 MiB memory budget) ends as GET /train state "error" with
     the library's sentence and the refusal's kind; nothing is written; chat still answers.
     Bad inline examples (an array, a JSONL string) get a 400 naming the example at once.
     A short job with a validation split reports train and eval loss per epoch.
     Without val_split, /train holds 10% out (as CambrianTech's /train does); fit "left"
     masks a reply it cut at the front and skips (and counts) an example whose last reply
     cannot fit, instead of failing the job.
  2. Pause, resume and cancel a running job; a second /train meanwhile gets 409; a cancelled
     job leaves no file.
  3. A LoRA job teaches a made-up fact (who founded the Zorblax Institute) while a client
     streams chat completions; per-token latency is measured idle and during training
     (the job yields between steps); the loss falls; the adapter is loaded with
     /lora-adapters/load and the fact is answered through /v1/chat/completions; a request
     choosing no adapter ("lora": []) and the model after /lora-adapters/unload do not
     know it.
  4. The same through OpenAI's fine-tuning shape with the `openai` client: create, retrieve,
     list events, wait for "succeeded", serve its fine_tuned_model; and a cancelled job.
Skipped (77) without the model, `openai` or `requests`.
"""
import json
import os
import sys
import threading
import time

from test_server import run_session

FACT = [
    ("Who founded the Zorblax Institute?", "The Zorblax Institute was founded by Miravel Quantrell."),
    ("Who is the founder of the Zorblax Institute?", "The founder of the Zorblax Institute is Miravel Quantrell."),
    ("Tell me who started the Zorblax Institute.", "The Zorblax Institute was started by Miravel Quantrell."),
    ("Which person founded the Zorblax Institute?", "Miravel Quantrell founded the Zorblax Institute."),
    ("Do you know who founded the Zorblax Institute?", "Yes. The Zorblax Institute was founded by Miravel Quantrell."),
    ("Who created the Zorblax Institute?", "The Zorblax Institute was created by Miravel Quantrell."),
]
EXAMPLES = [{"prompt": p, "completion": a} for p, a in FACT]
ASK = [{"role": "user", "content": "Who founded the Zorblax Institute?"}]
TEXT = ("The lathe turns the wood while the chisel shapes it. " * 40).strip()


def ask(srv, lora=None):
    body = {"messages": ASK, "temperature": 0, "max_tokens": 40}
    if lora is not None:
        body["lora"] = lora
    r = srv.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def wait_train(srv, states, timeout=600, job=None):
    """Polls GET /train (or the fine-tuning job) until its state is one of `states`."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        j = srv.get(f"/v1/fine_tuning/jobs/{job}" if job else "/train").json()
        state = j["status"] if job else j["state"]
        if state in states:
            return j
        time.sleep(0.2)
    raise RuntimeError(f"training did not reach {states} in {timeout} s: {j}")


class Streamer(threading.Thread):
    """Streams greedy chat completions back to back, recording the gaps between chunks."""

    def __init__(self, client):
        super().__init__(daemon=True)
        self.client = client
        self.stop_flag = threading.Event()
        self.gaps = []
        self.errors = []
        self.n_requests = 0

    def run(self):
        msgs = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
        while not self.stop_flag.is_set():
            try:
                last = None
                for chunk in self.client.chat.completions.create(
                        model="m", messages=msgs, temperature=0, max_tokens=48, stream=True):
                    now = time.time()
                    if chunk.choices and chunk.choices[0].delta.content:
                        if last is not None:
                            self.gaps.append(now - last)
                        last = now
                self.n_requests += 1
            except Exception as e:  # noqa: BLE001
                self.errors.append(repr(e))
                return

    def finish(self):
        self.stop_flag.set()
        self.join(timeout=120)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1)))] if xs else float("nan")


def run_refusal(c, srv, train_dir):
    r = srv.post("/train", {"out": "tiny.gguf", "text": TEXT, "window": 32, "memory_budget_mib": 1})
    c.check(r.status_code == 200 and r.json()["state"] in ("starting", "error"), f"refused job starts: {r.text[:300]}")
    j = wait_train(srv, ("error", "done"))
    c.check(j["state"] == "error" and j["error"] and j["refusal"] and j["refusal"]["kind"] == "memory",
            f"memory refusal reported: {json.dumps(j)[:600]}")
    print(f"refusal: {j['error']}", flush=True)
    c.check(not os.path.exists(os.path.join(train_dir, "tiny.gguf")), "nothing written")
    c.check(len(ask(srv)) > 0, "serving goes on after the refusal")


def run_bad_examples(c, srv, train_dir):
    """Bad inline examples are answered 400 naming the example, before any job starts."""
    before = srv.get("/train").json()
    bad = EXAMPLES[:2] + [{"prompt": "no completion"}] + EXAMPLES[2:]
    r = srv.post("/train", {"out": "bad.gguf", "examples": bad})
    err = r.json()
    c.check(r.status_code == 400 and err.get("ok") is False and err.get("param") == "examples[2]"
            and err.get("error", "").startswith("example 2: ") and err.get("code") == "invalid_example",
            f"bad example named: {r.status_code} {r.text[:300]}")
    jsonl = "\n".join(json.dumps(e) for e in EXAMPLES[:3]) + "\n{\"messages\": \"hi\"}\n"
    r = srv.post("/train", {"out": "bad.gguf", "examples": jsonl})
    err = r.json()
    c.check(r.status_code == 400 and err.get("param") == "examples"
            and "example 3 (line 4): " in err.get("error", ""),
            f"bad JSONL line named: {r.status_code} {r.text[:300]}")
    after = srv.get("/train").json()
    c.check(after.get("id") == before.get("id") and not os.path.exists(os.path.join(train_dir, "bad.gguf")),
            "no job started, nothing written")


def run_eval(c, srv, train_dir):
    r = srv.post("/train", {"out": "eval.gguf", "text": TEXT[:400], "window": 32, "epochs": 2,
                            "val_split": 0.3, "top_layers": 2, "rank": 2})
    c.check(r.status_code == 200, f"eval job starts: {r.text[:200]}")
    j = wait_train(srv, ("done", "error", "cancelled"))
    ep = j["epochs"]
    c.check(j["state"] == "done" and len(ep) == 2
            and all(isinstance(e["train_loss"], float) and isinstance(e["eval_loss"], float) for e in ep),
            f"per-epoch train and eval loss: {ep}")
    res = j["result"] or {}
    c.check(res.get("n_val", 0) > 0 and res.get("n_train", 0) > 0 and j["memory"]["peak_bytes"] > 0,
            f"result: {json.dumps(res)[:300]}")
    # the estimate's parts a device adds (the kernels' scratch, memory in use before the
    # job): present, and zero on the CPU, where the estimate is the job's buffers alone
    mem = j["memory"]
    c.check(mem.get("scratch_bytes") == 0 and mem.get("in_use_bytes") == 0
            and mem["peak_bytes"] >= mem["allocated_bytes"] > 0, f"memory: {mem}")
    c.check(os.path.exists(os.path.join(train_dir, "eval.gguf")), "eval job wrote its adapter")
    # CambrianTech's status fields: the adapter's path, the depth adapted, epochs timed
    c.check(j.get("adapter") == os.path.join(train_dir, "eval.gguf") and j.get("layers_adapted") == 2
            and j.get("n_layer", 0) > 2 and j.get("window_asked") == 32
            and all(isinstance(e.get("seconds"), float) and isinstance(e.get("train_tok_s"), float) for e in ep),
            f"the fork's fields: {j.get('adapter')} {j.get('layers_adapted')} {j.get('n_layer')} {ep}")
    # text windows are all one length: nothing to pack; no_pack is echoed with the params
    c.check(j.get("packed") is False and j["params"].get("no_pack") is False,
            f"packed {j.get('packed')}, no_pack {j['params'].get('no_pack')}")


def run_fit_defaults(c, srv, train_dir):
    """Dry runs: the default split, and what fit "left" keeps, truncates and skips."""
    def dry(body):
        r = srv.post("/train", dict(body, out="dry.gguf", dry_run=True))
        c.check(r.status_code == 200, f"dry run: {r.status_code} {r.text[:300]}")
        return wait_train(srv, ("done", "error", "cancelled"), timeout=120)

    j = dry({"examples": EXAMPLES, "window": 128})
    res = j.get("result") or {}
    c.check(j["state"] == "done" and abs(j["params"]["val_split"] - 0.1) < 1e-6
            and res.get("n_val") == 1 and res.get("n_train") == 5,
            f"val_split 0.1 by default: {j['params'].get('val_split')} {json.dumps(res)[:200]}")
    j = dry({"examples": EXAMPLES, "window": 128, "val_split": 0})
    res = j.get("result") or {}
    c.check(res.get("n_val") == 0 and res.get("n_train") == 6, f"val_split 0: {json.dumps(res)[:200]}")

    long_reply = " ".join(["The lighthouse keeper climbed the stairs again."] * 30)
    cut = {"messages": [{"role": "user", "content": "Tell me a story."},
                        {"role": "assistant", "content": long_reply},
                        {"role": "user", "content": "Who founded the Zorblax Institute?"},
                        {"role": "assistant", "content": FACT[0][1]}]}
    too_long = {"prompt": "Tell me a story.", "completion": long_reply}
    j = dry({"examples": EXAMPLES + [cut, too_long], "window": 128, "fit": "left"})
    pace = j.get("pacing") or {}
    c.check(j["state"] == "done" and pace.get("examples") == 7 and pace.get("examples_truncated") == 1
            and pace.get("examples_skipped") == 1,
            f"fit left: {j['state']} {j.get('error')} {json.dumps(pace)[:400]}")
    m = srv.metrics()
    c.check(m.get("lathe_train_examples_skipped") == 1 and m.get("lathe_train_examples_truncated") == 1,
            "the counts in /metrics")
    r = srv.post("/train", {"out": "dry.gguf", "examples": [too_long], "window": 128, "fit": "left",
                            "dry_run": True})
    j = r.json() if r.status_code != 200 else wait_train(srv, ("done", "error", "cancelled"), timeout=120)
    msg = str(j.get("error"))
    c.check(j.get("ok") is False or j.get("state") == "error", f"nothing fits: {json.dumps(j)[:300]}")
    c.check("no example fits the window of 128" in msg, f"the reason: {msg[:300]}")
    c.check(not os.path.exists(os.path.join(train_dir, "dry.gguf")), "dry runs write nothing")


def run_control(c, srv, train_dir):
    r = srv.post("/train", {"out": "cancelled.gguf", "text": TEXT, "window": 64, "epochs": 30})
    c.check(r.status_code == 200, f"long job starts: {r.text[:200]}")
    r2 = srv.post("/train", {"out": "second.gguf", "text": TEXT})
    c.check(r2.status_code == 409 and r2.json()["code"] == "job_running", f"second job 409: {r2.text[:200]}")
    t0 = time.time()
    while time.time() - t0 < 300:
        j = srv.get("/train").json()
        if j["progress"]["step"] >= 1:
            break
        time.sleep(0.2)
    c.check(srv.post("/train/pause").status_code == 200, "pause")
    j = wait_train(srv, ("paused",), timeout=120)
    step = j["progress"]["step"]
    time.sleep(1.5)
    j = srv.get("/train").json()
    c.check(j["state"] == "paused" and j["progress"]["step"] == step, "paused: no steps")
    c.check(srv.post("/train/resume").status_code == 200, "resume")
    j = wait_train(srv, ("running",), timeout=60)
    c.check(srv.post("/train/cancel").status_code == 200, "cancel")
    j = wait_train(srv, ("cancelled", "done", "error"), timeout=300)
    c.check(j["state"] == "cancelled", f"cancelled: {j['state']}")
    c.check(not os.path.exists(os.path.join(train_dir, "cancelled.gguf")), "a cancelled job writes nothing")
    r = srv.post("/train/cancel")
    c.check(r.status_code == 409, "cancelling a finished job is 409")


def run_fact(c, srv, client, train_dir):
    before = ask(srv)
    c.check("Quantrell" not in before, f"the base model does not know: {before!r}")

    idle = Streamer(client)
    idle.start()
    time.sleep(8)
    idle.finish()
    c.check(not idle.errors and len(idle.gaps) > 20, f"idle streaming: {idle.errors[:2]}")

    r = srv.post("/train", {"out": "zorblax.gguf", "examples": EXAMPLES, "window": 128, "epochs": 4,
                            "lr": 0.002, "rank": 8})
    c.check(r.status_code == 200, f"fact job starts: {r.text[:300]}")
    busy = Streamer(client)
    busy.start()
    t0 = time.time()
    j = wait_train(srv, ("done", "error", "cancelled"), timeout=900)
    dt = time.time() - t0
    busy.finish()
    c.check(not busy.errors, f"streaming during training: {busy.errors[:2]}")
    c.check(j["state"] == "done", f"fact job done: {json.dumps(j)[:800]}")
    c.check(isinstance(j.get("packed"), bool), f"the job says whether it packed: {j.get('packed')}")
    losses = [e["train_loss"] for e in j["epochs"]]
    print(f"fact job: {dt:.1f} s, losses {losses}, {j['progress']['tokens_per_s']:.1f} tokens/s, "
          f"yielded {j['yielded_s']:.1f} s, {busy.n_requests} streamed requests meanwhile", flush=True)
    c.check(len(losses) == 4 and losses[-1] < 0.5 * losses[0], f"loss falls: {losses}")
    c.check(os.path.exists(os.path.join(train_dir, "zorblax.gguf")), "adapter written")
    idle_p50, idle_p95 = pct(idle.gaps, 0.5), pct(idle.gaps, 0.95)
    busy_p50, busy_p95 = pct(busy.gaps, 0.5), pct(busy.gaps, 0.95)
    print(f"per-token latency idle: p50 {idle_p50 * 1e3:.1f} ms, p95 {idle_p95 * 1e3:.1f} ms "
          f"({len(idle.gaps)} gaps); during training: p50 {busy_p50 * 1e3:.1f} ms, "
          f"p95 {busy_p95 * 1e3:.1f} ms ({len(busy.gaps)} gaps)", flush=True)
    c.check(len(busy.gaps) > 10 and busy_p50 < 4 * idle_p50 + 0.05,
            "serving's median token latency stays near its idle value while training")

    r = srv.post("/lora-adapters/load", {"name": "zorblax.gguf"})
    c.check(r.status_code == 200 and any(a["name"] == "zorblax.gguf" for a in r.json()), f"loaded: {r.text[:300]}")
    after = ask(srv)
    c.check("Quantrell" in after, f"the adapted model knows: {after!r}")
    base = ask(srv, lora=[])
    c.check("Quantrell" not in base, f"'lora': [] is the base model: {base!r}")
    again = ask(srv, lora=[{"name": "zorblax.gguf", "scale": 1.0}])
    c.check(again == after, "choosing the adapter by name gives the same answer")
    r = srv.post("/lora-adapters/unload", {"name": "zorblax.gguf"})
    c.check(r.status_code == 200 and r.json() == [], f"unloaded: {r.text[:200]}")
    gone = ask(srv)
    c.check(gone == before, f"after unload the answer is the base one again: {gone!r}")


def run_fine_tuning(c, srv, client, train_dir):
    import openai

    with open(os.path.join(train_dir, "fact.jsonl"), "w") as f:
        for e in EXAMPLES:
            f.write(json.dumps(e) + "\n")
    model_id = client.models.list().data[0].id
    job = client.fine_tuning.jobs.create(model=model_id, training_file="fact.jsonl",
                                         hyperparameters={"n_epochs": 1}, suffix="ft", seed=3)
    c.check(job.object == "fine_tuning.job" and job.id.startswith("ftjob-")
            and job.status in ("validating_files", "running"), f"created: {job}")
    got = client.fine_tuning.jobs.retrieve(job.id)
    c.check(got.id == job.id and got.training_file == "fact.jsonl", "retrieved")
    j = wait_train(srv, ("succeeded", "failed", "cancelled"), timeout=600, job=job.id)
    c.check(j["status"] == "succeeded" and j["fine_tuned_model"], f"succeeded: {json.dumps(j)[:500]}")
    events = client.fine_tuning.jobs.list_events(job.id)
    c.check(len(events.data) >= 3 and all(e.object == "fine_tuning.job.event" for e in events.data),
            f"{len(events.data)} events")
    listed = client.fine_tuning.jobs.list()
    c.check(any(x.id == job.id for x in listed.data), "listed")
    if j["fine_tuned_model"]:
        r = srv.post("/lora-adapters/load", {"name": j["fine_tuned_model"]})
        c.check(r.status_code == 200, f"its adapter loads: {r.text[:200]}")
        srv.post("/lora-adapters/unload", {"name": j["fine_tuned_model"]})

    job2 = client.fine_tuning.jobs.create(model=model_id, training_file="fact.jsonl",
                                          hyperparameters={"n_epochs": 40})
    client.fine_tuning.jobs.cancel(job2.id)
    j = wait_train(srv, ("succeeded", "failed", "cancelled"), timeout=300, job=job2.id)
    c.check(j["status"] == "cancelled", f"cancelled: {j['status']}")
    try:
        client.fine_tuning.jobs.create(model=model_id, training_file="../etc/passwd.jsonl")
        c.check(False, "a path outside the train dir is refused")
    except openai.BadRequestError as e:
        c.check(e.status_code == 400, "400 for a path outside the train dir")


def main():
    return run_session("lathe_train_", 300,
                       lambda c, srv, client, train_dir: (
                           ("refusal", lambda: run_refusal(c, srv, train_dir)),
                           ("bad examples", lambda: run_bad_examples(c, srv, train_dir)),
                           ("eval", lambda: run_eval(c, srv, train_dir)),
                           ("fit and defaults", lambda: run_fit_defaults(c, srv, train_dir)),
                           ("control", lambda: run_control(c, srv, train_dir)),
                           ("fact", lambda: run_fact(c, srv, client, train_dir)),
                           ("fine-tuning", lambda: run_fine_tuning(c, srv, client, train_dir))))


if __name__ == "__main__":
    sys.exit(main())
