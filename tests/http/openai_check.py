"""Checks baton-coordinator's OpenAI-compatible HTTP API with the official
`openai` SDK and raw HTTP. Run by tests/http/http_cluster_test.cc against a
LocalCluster; exits non-zero with a message naming the first mismatch.

  openai_check.py MODE HOST:PORT
  MODE: sdk         chat / completions, streaming and not, logprobs, stop,
                    seeds, n, errors through the SDK
        bad         malformed and out-of-range requests over raw HTTP, each a
                    4xx with a clear message; the server keeps serving
        concurrent  64 streaming clients at once (AsyncOpenAI)
        slow        a client that does not read and one that disconnects
                    mid-stream while others are served
"""
import asyncio
import http.client
import json
import socket
import sys
import threading
import time

try:
    import openai
except ImportError as e:  # never a silent skip
    sys.exit(f"openai_check: the openai package is missing ({e}); run scripts/setup.sh")


class Mismatch(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Mismatch(message)


def log(message):
    print(f"openai_check: {message}", file=sys.stderr, flush=True)


def client(address):
    return openai.OpenAI(base_url=f"http://{address}/v1", api_key="unused",
                         max_retries=0, timeout=120)


def model_id(address):
    models = client(address).models.list().data
    check(len(models) == 1, f"/v1/models lists {len(models)} models, want 1")
    return models[0].id


def chat_messages(text):
    return [{"role": "user", "content": text}]


def stream_chat(c, **kwargs):
    """Streams a chat completion; returns (text, finish_reason, usage)."""
    parts, finish, usage, roles = [], None, None, 0
    for chunk in c.chat.completions.create(stream=True, **kwargs):
        check(chunk.object == "chat.completion.chunk", f"chunk object {chunk.object}")
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.role == "assistant":
                roles += 1
            if choice.delta.content:
                parts.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    check(roles == 1, f"{roles} role deltas in one stream, want 1")
    return "".join(parts), finish, usage


def check_sdk(address):
    model = model_id(address)
    c = client(address)
    msgs = chat_messages("Name three colours.")

    # Chat: non-streaming and streaming agree token for token (greedy).
    full = c.chat.completions.create(model=model, messages=msgs, max_tokens=16,
                                     temperature=0)
    check(full.object == "chat.completion", f"object {full.object}")
    check(full.id.startswith("chatcmpl-"), f"id {full.id}")
    check(full.model == model, f"model {full.model}")
    text = full.choices[0].message.content
    check(text, "empty chat completion")
    check(full.choices[0].message.role == "assistant", "role")
    check(full.choices[0].finish_reason in ("stop", "length"),
          f"finish_reason {full.choices[0].finish_reason}")
    check(full.usage.prompt_tokens > 0 and full.usage.completion_tokens > 0,
          f"usage {full.usage}")
    check(full.usage.total_tokens ==
          full.usage.prompt_tokens + full.usage.completion_tokens, "total_tokens")
    streamed, finish, usage = stream_chat(
        c, model=model, messages=msgs, max_tokens=16, temperature=0,
        stream_options={"include_usage": True})
    check(streamed == text, f"streamed chat {streamed!r} != {text!r}")
    check(finish == full.choices[0].finish_reason, f"stream finish {finish}")
    check(usage is not None and usage.completion_tokens == full.usage.completion_tokens,
          f"stream usage {usage} vs {full.usage}")
    log(f"chat ok: {text!r}")

    # Completions, both ways; a stop string cuts the text before it.
    prompt = "The three primary colours are"
    comp = c.completions.create(model=model, prompt=prompt, max_tokens=24,
                                temperature=0, extra_body={"ignore_eos": True})
    check(comp.object == "text_completion", f"object {comp.object}")
    ctext = comp.choices[0].text
    check(comp.choices[0].finish_reason == "length", "completion finish")
    check(comp.usage.completion_tokens == 24, f"usage {comp.usage}")
    parts = []
    for chunk in c.completions.create(model=model, prompt=prompt, max_tokens=24,
                                      temperature=0, stream=True,
                                      extra_body={"ignore_eos": True}):
        parts.extend(ch.text for ch in chunk.choices)
    check("".join(parts) == ctext, f"streamed completion {''.join(parts)!r} != {ctext!r}")
    words = ctext.split()
    check(len(words) >= 3, f"completion too short for a stop test: {ctext!r}")
    stop = words[2]
    cut = c.completions.create(model=model, prompt=prompt, max_tokens=24,
                               temperature=0, stop=[stop, "\x00never"])
    check(cut.choices[0].text == ctext[:ctext.find(stop)],
          f"stop {stop!r}: {cut.choices[0].text!r} vs {ctext!r}")
    check(cut.choices[0].finish_reason == "stop", "stop finish_reason")
    log(f"completions ok, stop {stop!r} ok")

    # Logprobs.
    lp = c.chat.completions.create(model=model, messages=msgs, max_tokens=8,
                                   temperature=0, logprobs=True, top_logprobs=3,
                                   extra_body={"ignore_eos": True})
    entries = lp.choices[0].logprobs.content
    check(len(entries) == lp.usage.completion_tokens == 8,
          f"{len(entries)} logprob entries for {lp.usage.completion_tokens} tokens")
    for e in entries:
        check(e.logprob <= 0 and len(e.top_logprobs) == 3, f"entry {e}")
        check(bytes(e.bytes).decode("utf-8", "replace") == e.token, f"bytes {e}")
        tops = [t.logprob for t in e.top_logprobs]
        check(tops == sorted(tops, reverse=True), f"top_logprobs order {tops}")
        check(abs(tops[0] - e.logprob) < 1e-5, "greedy token is the top one")
    check("".join(e.token for e in entries) == lp.choices[0].message.content,
          "logprob tokens do not spell the content")
    clp = c.completions.create(model=model, prompt=prompt, max_tokens=6,
                               temperature=0, logprobs=2)
    l = clp.choices[0].logprobs
    check(len(l.tokens) == len(l.token_logprobs) == len(l.top_logprobs) ==
          len(l.text_offset) == clp.usage.completion_tokens,
          f"completion logprobs lengths {l}")
    check(all(1 <= len(t) <= 2 for t in l.top_logprobs), f"top {l.top_logprobs}")
    check(l.text_offset == sorted(l.text_offset), "text_offset not increasing")
    log("logprobs ok")

    # Seeds: the same seed samples the same text; n = 2 uses seed, seed + 1.
    def sample(seed, n=1):
        r = c.completions.create(model=model, prompt="Once upon a time",
                                 max_tokens=16, temperature=0.8, seed=seed, n=n,
                                 extra_body={"ignore_eos": True})
        return [ch.text for ch in sorted(r.choices, key=lambda ch: ch.index)]
    a, b = sample(1234), sample(1234)
    check(a == b, f"seed 1234 gave {a!r} then {b!r}")
    others = [sample(s)[0] for s in (1235, 1236, 1237)]
    check(any(o != a[0] for o in others), "different seeds never differ")
    pair = sample(1234, n=2)
    check(pair == [a[0], others[0]], f"n=2 seed 1234 {pair!r} != {[a[0], others[0]]!r}")
    log("seeds ok")

    # Errors keep the SDK's types.
    try:
        c.chat.completions.create(model="no-such-model", messages=msgs, max_tokens=4)
        raise Mismatch("unknown model did not fail")
    except openai.NotFoundError as e:
        check(e.status_code == 404 and "no-such-model" in str(e), f"404: {e}")
    try:
        c.chat.completions.create(model=model, messages=msgs, max_tokens=1000000)
        raise Mismatch("max_tokens beyond the context did not fail")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "context_length" in str(e), f"400: {e}")
    again = c.chat.completions.create(model=model, messages=msgs, max_tokens=4)
    check(again.choices[0].message.content is not None, "good request after errors")
    log("errors ok")


def raw(address, method, path, body=None, headers=None):
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        conn.close()


def check_bad(address):
    model = model_id(address)
    good = {"model": model, "messages": chat_messages("Hi"), "max_tokens": 4}

    def body(**overrides):
        return json.dumps({**good, **overrides})
    cases = [
        ("invalid JSON", "POST", "/v1/chat/completions", "{not json", 400, "not valid JSON"),
        ("wrong type", "POST", "/v1/chat/completions", body(temperature="hot"),
         400, "temperature must be a number"),
        ("wrong type", "POST", "/v1/chat/completions", body(max_tokens="4"),
         400, "max_tokens must be an integer"),
        ("out of range", "POST", "/v1/chat/completions", body(top_p=1.5), 400, "top_p"),
        ("out of range", "POST", "/v1/chat/completions", body(n=0), 400, "n must be in"),
        ("unknown model", "POST", "/v1/chat/completions", body(model="nope"),
         404, "not served"),
        ("beyond the context", "POST", "/v1/completions",
         json.dumps({"model": model, "prompt": "Hi", "max_tokens": 9000}),
         400, "context_length"),
        ("over a request limit", "POST", "/v1/chat/completions",
         body(stop=[f"s{i}" for i in range(20)]), 400,
         "stop: 20 strings, the limit is 16 (--max_stop_strings)", "stop"),
        # Baton's names for a prompt's parts come back in the request's own.
        ("token id outside the vocabulary", "POST", "/v1/completions",
         json.dumps({"model": model, "prompt": [[1], [99999]], "max_tokens": 4}),
         400, "prompt[1][0]: 99999 is outside", "prompt[1][0]"),
        ("unknown chat role", "POST", "/v1/chat/completions",
         body(messages=[{"role": "tool", "content": "x"}]), 400,
         "messages[0].role: 'tool' is not one of", "messages[0].role"),
        ("unknown chat role, no max_tokens", "POST", "/v1/chat/completions",
         json.dumps({"model": model, "messages": [{"role": "tool", "content": "x"}]}),
         400, "messages[0].role: 'tool' is not one of", "messages[0].role"),
        ("mixed prompt array", "POST", "/v1/completions",
         json.dumps({"model": model, "prompt": ["a", [1]], "max_tokens": 4}),
         400, "prompt[1] is array but prompt[0] is string"),
        ("too large", "POST", "/v1/chat/completions", "x" * (2 << 20), 413,
         "--http_max_body_bytes"),
        ("unknown route", "GET", "/v2/everything", None, 404, "no route"),
        ("wrong method", "GET", "/v1/completions", None, 405, "use POST"),
    ]
    for name, method, path, data, status, needle, *param in cases:
        got, text = raw(address, method, path, data)
        check(got == status, f"{name}: HTTP {got}, want {status}: {text}")
        error = json.loads(text)["error"]
        check(needle in error["message"], f"{name}: message {error['message']!r} lacks {needle!r}")
        if param:
            check(error["param"] == param[0], f"{name}: param {error['param']!r}, want {param[0]!r}")
        check(set(error) == {"message", "type", "param", "code"}, f"{name}: {error}")
        log(f"{name}: {got} {error['message']!r}")
    status, text = raw(address, "POST", "/v1/chat/completions", body())
    check(status == 200 and json.loads(text)["choices"], f"good request after bad: {status} {text}")


async def check_concurrent(address, clients=64, max_tokens=8):
    model = model_id(address)
    c = openai.AsyncOpenAI(base_url=f"http://{address}/v1", api_key="unused",
                           max_retries=0, timeout=300)

    async def one(i):
        parts, finish, usage = [], None, None
        stream = await c.chat.completions.create(
            model=model, messages=chat_messages(f"Count to {i}."), max_tokens=max_tokens,
            temperature=0.7, seed=i, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                parts.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        check(finish == "length", f"client {i}: finish {finish}")
        check(usage is not None and usage.completion_tokens == max_tokens,
              f"client {i}: usage {usage}")
        return "".join(parts)
    start = time.monotonic()
    texts = await asyncio.gather(*(one(i) for i in range(clients)))
    check(len(texts) == clients, "missing results")
    log(f"{clients} concurrent streams done in {time.monotonic() - start:.1f} s")
    await c.close()


def open_stream(address, payload, rcvbuf=None):
    host, port = address.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect((host, int(port)))
    body = json.dumps(payload).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\n" +
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return s


def active_requests(address):
    status, text = raw(address, "GET", "/health")
    check(status == 200, f"/health {status}: {text}")
    return json.loads(text)["active_requests"]


def check_slow(address):
    model = model_id(address)
    base = {"model": model, "messages": chat_messages("Tell me a story."),
            "stream": True, "ignore_eos": True, "temperature": 0}
    # Reads nothing until the end: ~400 KB of chunks wait for it.
    slow = open_stream(address, {**base, "max_tokens": 256, "logprobs": True,
                                 "top_logprobs": 20}, rcvbuf=4096)
    # Leaves after its first chunk; unless cancelled it would decode for
    # tens of seconds.
    leaver = open_stream(address, {**base, "max_tokens": 3000})
    seen = b""
    while b"data: " not in seen:
        part = leaver.recv(65536)
        check(part, "the leaving client got no data")
        seen += part
    leaver.close()

    c = client(address)
    results, errors = [], []

    def normal(i):
        try:
            text, finish, usage = stream_chat(
                c, model=model, messages=chat_messages(f"Say {i}."), max_tokens=16,
                extra_body={"ignore_eos": True}, stream_options={"include_usage": True})
            check(usage.completion_tokens == 16 and finish == "length", f"normal {i}")
            results.append(text)
        except Exception as e:  # reported below
            errors.append(e)
    start = time.monotonic()
    threads = [threading.Thread(target=normal, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, f"normal clients failed: {errors}")
    took = time.monotonic() - start
    log(f"8 normal streams done in {took:.1f} s beside a stalled reader")

    # The cluster finishes the stalled reader's request and cancels the
    # leaver's while the stalled client still has read nothing. The wait is
    # sized from this host's decode steps just measured (16 per normal
    # stream): the stalled request has at most 256 left, an uncancelled
    # leaver thousands.
    allowed = 20 + 3 * 256 * took / 16
    deadline = time.monotonic() + allowed
    while active_requests(address) != 0:
        check(time.monotonic() < deadline,
              f"requests still active {allowed:.0f} s later (leaver not cancelled?)")
        time.sleep(0.05)
    log("no active request while the slow client still has not read")

    data = b""
    while not data.endswith(b"0\r\n\r\n"):
        part = slow.recv(65536)
        check(part, "slow stream closed early")
        data += part
    slow.close()
    events = [l.strip() for l in data.split(b"\r\n") if l.startswith(b"data: ")]
    check(events[-1] == b"data: [DONE]", f"last event {events[-1][:80]!r}")
    tokens = sum(len(json.loads(e[6:])["choices"][0]["logprobs"]["content"])
                 for e in events[:-1]
                 if json.loads(e[6:])["choices"][0].get("logprobs"))
    check(tokens == 256, f"slow client got {tokens} tokens, want 256")
    log(f"slow client read {len(data)} bytes, {tokens} tokens, then [DONE]")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    mode, address = sys.argv[1], sys.argv[2]
    try:
        if mode == "sdk":
            check_sdk(address)
        elif mode == "bad":
            check_bad(address)
        elif mode == "concurrent":
            asyncio.run(check_concurrent(address))
        elif mode == "slow":
            check_slow(address)
        else:
            sys.exit(f"openai_check: unknown mode {mode!r}")
    except (Mismatch, openai.OpenAIError) as e:
        sys.exit(f"openai_check {mode}: FAILED: {type(e).__name__}: {e}")
    log(f"{mode}: all checks passed")


if __name__ == "__main__":
    main()
