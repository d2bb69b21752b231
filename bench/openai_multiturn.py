#!/usr/bin/env python3
"""The multi-turn chat workload over an OpenAI-compatible HTTP server, so
that Baton's gateway and llama.cpp's server (llama-cpp-python[server]) are
measured by the same client on the same requests.

The shape of `baton-bench --dataset-name=multiturn`, in text, as a chat
client sends it: conversations share a system prompt; turn t sends the
system prompt, t user messages and the t - 1 answers this server gave, as
one prompt to /v1/completions (greedy, streamed, end-of-sequence masked so
every answer has --output_len tokens). The text is made of whole-word
tokens of the model's own vocabulary (a word with its leading space is one
token), so a prompt of N words is about N tokens on both servers. The
answers are resent as the text the server streamed, which the server
tokenizes again: where that splits differently from what it generated, its
prefix cache stops there, on either server alike.

One conversation after another, one request at a time by default
(llama-cpp-python's server serves one at a time); --concurrency runs that
many conversations side by side (Baton only).

Prints one JSON object: TTFT p50/p90 of first and of later turns, wall
time, output tokens per second, and, where the server reports usage (Baton),
prompt and cached tokens per later turn.

    python bench/openai_multiturn.py --url http://127.0.0.1:8000 \\
        --server llama_cpp --model models/M.gguf
"""
import argparse
import concurrent.futures
import http.client
import json
import random
import re
import statistics
import sys
import time
import urllib.parse

import gguf


def percentile(values, p):
    if not values:
        return 0.0
    values = sorted(values)
    k = (len(values) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def vocabulary(model_path):
    """(whole-word tokens as text with their leading space, EOS id)."""
    reader = gguf.GGUFReader(model_path)
    f = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]
    words = [t.replace("\u0120", " ") for t in tokens
             if re.fullmatch("\u0120[a-z]{3,9}", t)]
    eos_field = reader.fields["tokenizer.ggml.eos_token_id"]
    eos = int(eos_field.parts[eos_field.data[0]][0])
    return words, eos


def connect(url, timeout_s):
    parts = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port,
                                      timeout=timeout_s)


def served_model(url, timeout_s):
    """The first model the server's /v1/models lists."""
    conn = connect(url, timeout_s)
    conn.request("GET", "/v1/models")
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"GET /v1/models: HTTP {resp.status}: {body[:500]!r}")
    return json.loads(body)["data"][0]["id"]


def stream_completion(url, body, timeout_s):
    """Sends one streamed completion; returns (TTFT ms, text, usage)."""
    conn = connect(url, timeout_s)
    sent = time.perf_counter()
    conn.request("POST", "/v1/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:500]!r}")
    ttft, text, usage = None, [], None
    for raw in resp:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            break
        event = json.loads(data)
        if event.get("usage"):
            usage = event["usage"]
        choices = event.get("choices") or []
        if choices:
            if ttft is None:
                ttft = (time.perf_counter() - sent) * 1e3
            text.append(choices[0].get("text") or "")
    conn.close()
    if ttft is None:
        raise RuntimeError("the stream ended without a token")
    return ttft, "".join(text), usage


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="http://HOST:PORT")
    ap.add_argument("--server", choices=["baton", "llama_cpp"], required=True,
                    help="how to mask end-of-sequence: Baton's ignore_eos, "
                    "or a logit bias on llama.cpp's server")
    ap.add_argument("--model", required=True,
                    help="the GGUF file both servers load (its vocabulary)")
    ap.add_argument("--model_name", default="",
                    help="the requests' model field (default: the first "
                    "model the server lists)")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--system_len", type=int, default=512)
    ap.add_argument("--user_len", type=int, default=64)
    ap.add_argument("--output_len", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout_s", type=float, default=600.0)
    args = ap.parse_args()
    for name in ("conversations", "turns", "user_len", "output_len",
                 "concurrency"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.system_len < 0:
        ap.error(f"--system_len must be >= 0, got {args.system_len}")

    words, eos = vocabulary(args.model)
    rng = random.Random(args.seed)
    text = lambda n: "".join(rng.choice(words) for _ in range(n))  # noqa: E731
    system = text(args.system_len)
    users = [[text(args.user_len) for _ in range(args.turns)]
             for _ in range(args.conversations)]
    base = {"model": args.model_name or served_model(args.url, args.timeout_s),
            "max_tokens": args.output_len, "temperature": 0.0, "stream": True}
    if args.server == "baton":
        base.update(ignore_eos=True, stream_options={"include_usage": True})
    else:
        # llama-cpp-python's sampling defaults, set to plain greedy.
        base.update(logit_bias={str(eos): -1e9}, repeat_penalty=1.0,
                    top_k=0, top_p=1.0, min_p=0.0)

    # One short request first, outside the figures: a server's first
    # completion also pays its warm-up.
    warm = random.Random(args.seed + 1)
    stream_completion(args.url, dict(
        base, max_tokens=4,
        prompt="".join(warm.choice(words) for _ in range(16))), args.timeout_s)

    def conversation(c):
        turns = []
        history = system
        for t in range(args.turns):
            history += users[c][t]
            ttft, answer, usage = stream_completion(
                args.url, dict(base, prompt=history), args.timeout_s)
            turns.append((t, ttft, usage))
            history += answer
        return turns

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(conversation, range(args.conversations)))
    wall = time.perf_counter() - start
    first = [ttft for turns in results for t, ttft, _ in turns if t == 0]
    later = [ttft for turns in results for t, ttft, _ in turns if t > 0]
    usages = [u for turns in results for t, _, u in turns if t > 0 and u]
    summary = {
        "server": args.server, "url": args.url,
        "conversations": args.conversations, "turns": args.turns,
        "concurrency": args.concurrency, "duration_s": wall,
        "output_tokens_per_s":
            args.conversations * args.turns * args.output_len / wall,
        "first_turns": {"turns": len(first),
                        "ttft_ms_p50": statistics.median(first),
                        "ttft_ms_p90": percentile(first, 90)},
        "later_turns": {"turns": len(later),
                        "ttft_ms_p50": statistics.median(later) if later else 0,
                        "ttft_ms_p90": percentile(later, 90)},
    }
    if usages:
        summary["later_turns"]["prompt_tokens_mean"] = statistics.mean(
            u["prompt_tokens"] for u in usages)
        summary["later_turns"]["cached_tokens_mean"] = statistics.mean(
            (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            for u in usages)
    json.dump(summary, sys.stdout)
    print()


if __name__ == "__main__":
    main()
