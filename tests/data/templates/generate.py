#!/usr/bin/env python3
"""Regenerates the chat-template test data in this folder from Jinja2 itself.

usage: /usr/bin/python3 tests/data/templates/generate.py      (needs Debian's python3-jinja2)

1. Extracts the chat templates that ../shared carries: tokenizer_config.json of
   ../shared/tokenizers/*-hf (hf-<name>.jinja) and `tokenizer.chat_template` of
   ../shared/vocab/*.gguf (gguf-<name>.jinja).
2. Renders every *.jinja here and in ../shared/templates for each conversation: the
   three of ../shared/tools/render_templates.py through its own render(), and a few more
   (tool calls, thinking) through a copy of that function that also passes extra
   variables (tools, enable_thinking). bos_token is <BOS>, eos_token <EOS>.
3. Writes expected/<template>.<conversation>.txt with the rendered text, or
   expected/<template>.<conversation>.error with "raise: <message>" when the template
   called raise_exception, "error: <Type>: <message>" when Jinja2 failed otherwise.
   expected/conversations.json holds every conversation (messages,
   add_generation_prompt, extra context) for tests/chat_template_test.cpp.
4. Templates whose rendering depends on the date (gpt-oss's): rendered with the date
   DATED into expected-dated/ instead, with DATED_CONVS too (expected-dated/conversations.json).

openai-gpt-oss-120b.jinja is gpt-oss's published template as llama.cpp's repository
keeps it (models/templates/, commit dc02e1f83), copied unchanged.

The hand-written templates here (chatml, zephyr-7b-beta, tinyllama-1.1b-chat-v1.0,
mistral-7b-instruct-v0.1, phi-3-mini-4k-instruct, llama-2-7b-chat) are those models'
published templates; builtin-*.jinja are kiln's fallbacks (src/chat/builtin_templates.cpp
must hold the same text, a test checks it); features.jinja tours the language.
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
SHARED = os.path.join(os.path.dirname(REPO), "shared")
sys.path.insert(0, os.path.join(SHARED, "tools"))
sys.dont_write_bytecode = True  # leave no __pycache__ in ../shared

import render_templates as rt  # noqa: E402
from jinja2 import TemplateError  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"}},
        "required": ["city"]}}}]

# name: (messages, add_generation_prompt, extra variables)
EXTRA_CONVS = {
    "tools": ([{"role": "system", "content": "You are a helpful assistant."},
               {"role": "user", "content": "What's the weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call12345", "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
               {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
                "content": "{\"temperature\": 21, \"unit\": \"celsius\"}"},
               {"role": "assistant", "content": "It is 21 °C in Paris."}], False, {"tools": TOOLS}),
    "think": ([{"role": "user", "content": "What is 2+2?"},
               {"role": "assistant", "content": "<think>\nSimple arithmetic.\n</think>\n\n2 + 2 = 4."},
               {"role": "user", "content": "And 3+3?"}], True, {"enable_thinking": False}),
}


# Templates whose text depends on the date (gpt-oss's system message states it) are
# rendered once more with strftime_now() returning DATED, into expected-dated/, for every
# conversation plus DATED_CONVS; the test puts today's date where kiln wrote it.
DATED = "2026-12-02"
DATED_CONVS = {
    # gpt-oss's harmony format: a developer message, the reasoning effort, the builtin
    # tools, an assistant turn with its chain of thought ("thinking"), a tool call.
    "harmony": ([{"role": "developer", "content": "Answer briefly."},
                 {"role": "user", "content": "What is 2+2?"},
                 {"role": "assistant", "content": "4", "thinking": "Simple arithmetic."},
                 {"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "content": "", "thinking": "Call the tool.", "tool_calls": [
                     {"id": "c1", "type": "function",
                      "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                 {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "21 C"}], True,
                {"reasoning_effort": "high", "builtin_tools": ["browser", "python"],
                 "model_identity": "You are a test model.", "tools": TOOLS}),
}


def render_extra(src, messages, agp, date, extra):
    """render_templates.render with extra template variables."""
    def raise_exception(msg):
        raise TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: date
    return env.from_string(src).render(messages=messages, add_generation_prompt=agp,
                                       bos_token="<BOS>", eos_token="<EOS>", **extra)


def gguf_chat_template(path):
    """tokenizer.chat_template from a GGUF's metadata, or None."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"GGUF":
        return None
    version, = struct.unpack_from("<I", data, 4)
    pos = 8
    if version == 1:
        return None
    _, n_kv = struct.unpack_from("<QQ", data, pos)
    pos += 16
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def read_string(p):
        n, = struct.unpack_from("<Q", data, p)
        return data[p + 8:p + 8 + n].decode("utf-8"), p + 8 + n

    def skip_value(t, p):
        if t in sizes:
            return p + sizes[t]
        if t == 8:
            return read_string(p)[1]
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, p)
            p += 12
            for _ in range(n):
                p = skip_value(et, p)
            return p
        raise ValueError(f"{path}: unknown GGUF type {t}")

    for _ in range(n_kv):
        key, pos = read_string(pos)
        t, = struct.unpack_from("<I", data, pos)
        pos += 4
        if key == "tokenizer.chat_template" and t == 8:
            return read_string(pos)[0]
        pos = skip_value(t, pos)
    return None


def extract():
    tok_dir = os.path.join(SHARED, "tokenizers")
    for name in sorted(os.listdir(tok_dir)):
        cfg = os.path.join(tok_dir, name, "tokenizer_config.json")
        if not os.path.exists(cfg):
            continue
        tpl = json.load(open(cfg, encoding="utf-8")).get("chat_template")
        if isinstance(tpl, list):  # [{"name": "default", "template": ...}, ...]
            tpl = next((t["template"] for t in tpl if t.get("name") == "default"), None)
        if not isinstance(tpl, str):
            print(f"no chat template in {cfg}")
            continue
        out = os.path.join(HERE, f"hf-{name[:-3] if name.endswith('-hf') else name}.jinja")
        open(out, "w", encoding="utf-8").write(tpl)
        print(f"extracted {os.path.basename(out)}")
    vocab_dir = os.path.join(SHARED, "vocab")
    for name in sorted(os.listdir(vocab_dir)):
        if not name.endswith(".gguf"):
            continue
        tpl = gguf_chat_template(os.path.join(vocab_dir, name))
        if tpl is None:
            continue
        stem = name[:-5].replace("ggml-vocab-", "")
        out = os.path.join(HERE, f"gguf-{stem}.jinja")
        open(out, "w", encoding="utf-8").write(tpl)
        print(f"extracted {os.path.basename(out)}")


def main():
    extract()
    out_dir = os.path.join(HERE, "expected")
    os.makedirs(out_dir, exist_ok=True)
    for old in os.listdir(out_dir):
        os.remove(os.path.join(out_dir, old))
    convs = {k: (m, a, {}) for k, (m, a) in rt.CONVS.items()}
    convs.update(EXTRA_CONVS)
    json.dump({k: {"messages": m, "add_generation_prompt": a, "context": x} for k, (m, a, x) in convs.items()},
              open(os.path.join(out_dir, "conversations.json"), "w", encoding="utf-8"), ensure_ascii=False, indent=1)
    dated_dir = os.path.join(HERE, "expected-dated")
    os.makedirs(dated_dir, exist_ok=True)
    for old in os.listdir(dated_dir):
        os.remove(os.path.join(dated_dir, old))
    dated_convs = dict(convs)
    dated_convs.update(DATED_CONVS)
    json.dump({k: {"messages": m, "add_generation_prompt": a, "context": x} for k, (m, a, x) in dated_convs.items()},
              open(os.path.join(dated_dir, "conversations.json"), "w", encoding="utf-8"), ensure_ascii=False, indent=1)
    sources = [(os.path.join(SHARED, "templates"), n) for n in sorted(os.listdir(os.path.join(SHARED, "templates")))]
    sources += [(HERE, n) for n in sorted(os.listdir(HERE))]
    for folder, name in sources:
        if not name.endswith(".jinja"):
            continue
        src = open(os.path.join(folder, name), encoding="utf-8").read()
        for conv, (msgs, agp, extra) in convs.items():
            def one(date):
                if conv in rt.CONVS:
                    return rt.render(src, msgs, agp, date)
                return render_extra(src, msgs, agp, date, extra)
            stem = os.path.join(out_dir, f"{name[:-6]}.{conv}")
            try:
                text = one("02 Dec 2026")
                if text != one("15 Jan 2031"):
                    print(f"{name} {conv}: depends on the date, written to expected-dated/")
                    for dconv, (dm, da, dx) in ([(conv, convs[conv])] +
                                                (list(DATED_CONVS.items()) if conv == "hello" else [])):
                        text = (rt.render(src, dm, da, DATED) if dconv in rt.CONVS
                                else render_extra(src, dm, da, DATED, dx))
                        open(os.path.join(dated_dir, f"{name[:-6]}.{dconv}.txt"), "w", encoding="utf-8",
                             newline="").write(text)
                    continue
                open(stem + ".txt", "w", encoding="utf-8", newline="").write(text)
            except TemplateError as e:
                kind = "raise" if type(e) is TemplateError else f"error: {type(e).__name__}"
                open(stem + ".error", "w", encoding="utf-8").write(f"{kind}: {e.message}")
            except Exception as e:  # TypeError and friends from inside the template
                open(stem + ".error", "w", encoding="utf-8").write(f"error: {type(e).__name__}: {e}")
    print(f"wrote {len(os.listdir(out_dir)) - 1} expected files")


if __name__ == "__main__":
    main()
