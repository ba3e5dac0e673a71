#!/usr/bin/env python3
"""Load client for bench/llamacpp: the official OpenAI Python SDK against real llama.cpp servers.

Two workloads, each a closed loop of `--clients` concurrent clients for `--warmup` + `--duration`
seconds, then it stops by itself:

  affinity  multi-turn conversations that share long system prompts: every conversation picks one
            of `--prompts` system prompts (seeded), runs 3-4 turns, and appends the assistant's
            reply and a new user turn each time. Streaming, `"stop": ["\\n"]`.
  mixed     independent requests: short or long prompts (long ones unique, so no cache helps),
            streaming or not, sent through the gateway or as a client-side round robin over the
            servers (`--url` given more than once).

Only requests that start after the warm-up and finish before the end are recorded; the ones still
running at the end are cancelled and counted as `cut_off`. llama.cpp's /metrics (`--metrics-url`,
once per server) are read when the window opens and when it closes. Prints one line
`JSON:{...}` on stdout with the summary and every recorded request.

The SDK runs with max_retries=0, so every failure is visible, and a per-request timeout; after a
failed request a client pauses `--error-pause` seconds (1 s) before its next one.
"""

import argparse
import asyncio
import json
import random
import sys
import time
import urllib.request

import httpx2
import openai
from openai import AsyncOpenAI

# Common one-token English words: prompts of N words are close to N tokens for Gemma's tokenizer.
WORDS = (
    "the of and to in is was for on that with as by at from it this be are or an had not but what "
    "all were when we there can been has more if will one so no out up who them some time could "
    "than first water been call people way made find long down day did get come may part over new "
    "sound take only little work know place year live back give most very after thing just name "
    "good sentence man think say great where help through much before line right too mean old any "
    "same tell boy follow came want show also around form three small set put end does another well "
    "large must big even such because turn here why ask went men read need land different home us "
    "move try kind hand picture again change off play spell air away animal house point page letter "
    "mother answer found study still learn should world high every near add food between own below "
    "country plant last school father keep tree never start city earth eye light thought head under "
    "story saw left few while along might close something seem next hard open example begin life "
    "always those both paper together got group often run important until children side feet car "
    "mile night walk white sea began grow took river four carry state once book hear stop without "
    "second later miss idea enough eat face watch far real almost let above girl sometimes mountain "
    "cut young talk soon list song being leave family"
).split()


def sentence(rng: random.Random, lo: int, hi: int) -> str:
    n = rng.randint(lo, hi)
    words = [rng.choice(WORDS) for _ in range(n)]
    return words[0].capitalize() + " " + " ".join(words[1:]) + "."


def text(rng: random.Random, words: int) -> str:
    out, n = [], 0
    while n < words:
        s = sentence(rng, 8, 16)
        out.append(s)
        n += s.count(" ") + 1
    return " ".join(out)


def system_prompts(seed: int, count: int, lo: int, hi: int):
    """`count` distinct long system prompts, the same for the same seed."""
    prompts = []
    for i in range(count):
        rng = random.Random(f"system-{seed}-{i}")
        words = lo + (hi - lo) * i // max(1, count - 1)
        prompts.append(
            f"You are assistant {i + 1}. Answer in one short sentence, using the reference below.\n\n"
            f"Reference {i + 1}:\n{text(rng, words)}"
        )
    return prompts


def pct(xs, p):
    """Nearest-rank percentile (the same as bench/lib/sse_bench.py)."""
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * len(xs) + 0.5)) - 1))
    return xs[k]


def scrape(url: str):
    """llamacpp:* counters from one server's /metrics, or an error string."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = r.read().decode()
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return {"error": f"{type(e).__name__}: {e}"}
    m = {}
    for line in body.splitlines():
        if line.startswith("llamacpp:"):
            name, _, value = line.partition(" ")
            try:
                m[name] = float(value)
            except ValueError:
                pass
    return m


def error_label(e: Exception) -> str:
    """`STATUS code` for an HTTP error, else the kind of failure."""
    if isinstance(e, openai.APIStatusError):
        body = e.body if isinstance(e.body, dict) else {}
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        code = inner.get("code")
        if not isinstance(code, str):
            code = inner.get("type")
        return f"{e.status_code} {code}" if code else str(e.status_code)
    if isinstance(e, openai.APITimeoutError):
        return "timeout"
    if isinstance(e, openai.APIConnectionError):
        return "connection"
    return type(e).__name__


def http_client(keepalive: bool):
    """The SDK's own HTTP client, by default without keep-alive.

    llama.cpp closes the connection after every streamed response although it answers
    `Keep-Alive`, so a pooled connection is often dead when reused, and with max_retries=0 the SDK
    reports that as a connection error. A fresh connection per request (cheap on loopback, next
    to seconds of inference) keeps those client-side failures out of every path alike.
    """
    if keepalive:
        return openai.DefaultAsyncHttpxClient()
    return openai.DefaultAsyncHttpxClient(limits=httpx2.Limits(max_keepalive_connections=0))


class Run:
    """Shared state of one run: the clock, the window, the recorded requests."""

    def __init__(self, a):
        self.a = a
        self.t0 = time.monotonic()
        self.window_start = self.t0 + a.warmup
        self.window_end = self.window_start + a.duration
        self.records = []
        self.started = 0
        self.in_window_started = 0
        self.finished = 0
        self.rr = 0
        self.clients = [
            AsyncOpenAI(base_url=u, api_key=a.api_key, max_retries=0, timeout=a.timeout,
                        http_client=http_client(a.keepalive)) for u in a.url
        ]

    def pick(self):
        """The next base URL: a client-side round robin when there are several."""
        i = self.rr % len(self.clients)
        self.rr += 1
        return i, self.clients[i]

    def more(self) -> bool:
        return time.monotonic() < self.window_end and self.started < self.a.max_requests

    async def request(self, body: dict, meta: dict) -> dict:
        """Sends one chat completion; records it when it falls in the window. Returns the outcome."""
        idx, client = self.pick()
        self.started += 1
        start = time.monotonic()
        in_window = start >= self.window_start
        if in_window:
            self.in_window_started += 1
        rec = {**meta, "t": round(start - self.t0, 3), "url": idx, "stream": bool(body.get("stream"))}
        ttft = None
        content = []
        usage = None
        try:
            if body.get("stream"):
                stream = await client.chat.completions.create(
                    **body, stream_options={"include_usage": True}, extra_headers=meta.get("headers")
                )
                chunks = 0
                async for ch in stream:
                    if ch.choices and ch.choices[0].delta.content:
                        chunks += 1
                        if ttft is None:
                            ttft = time.monotonic() - start
                        content.append(ch.choices[0].delta.content)
                    if ch.usage:
                        usage = ch.usage
                rec["chunks"] = chunks
            else:
                r = await client.chat.completions.create(**body, extra_headers=meta.get("headers"))
                usage = r.usage
                if r.choices and r.choices[0].message.content:
                    content.append(r.choices[0].message.content)
            rec["status"] = 200
        except Exception as e:  # noqa: BLE001 - every failure is an outcome to count
            rec["status"] = error_label(e)
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
        end = time.monotonic()
        self.finished += 1
        rec["total"] = round(end - start, 4)
        if ttft is not None:
            rec["ttft"] = round(ttft, 4)
        if usage is not None:
            rec["out_tokens"] = usage.completion_tokens
            rec["prompt_tokens"] = usage.prompt_tokens
            details = getattr(usage, "prompt_tokens_details", None)
            if details is not None and details.cached_tokens is not None:
                rec["cached_tokens"] = details.cached_tokens
        rec.pop("headers", None)
        if in_window and end <= self.window_end:
            self.records.append(rec)
        ok = rec["status"] == 200
        if not ok and self.a.error_pause > 0:
            # A closed loop would otherwise turn a fast refusal into a burst of them and let the
            # failures, not the offered load, decide the success rate.
            await asyncio.sleep(self.a.error_pause)
        return {"ok": ok, "content": "".join(content)}


async def affinity_client(run: Run, cid: int, prompts):
    a = run.a
    rng = random.Random(f"client-{a.seed}-{cid}")
    conv = 0
    while run.more():
        p = rng.randrange(len(prompts))
        turns = rng.randint(a.turns_min, a.turns_max)
        conv_id = f"c{cid}-{conv}"
        conv += 1
        messages = [{"role": "system", "content": prompts[p]}]
        for turn in range(turns):
            if not run.more():
                return
            messages.append({"role": "user", "content": f"Question {turn + 1}: {sentence(rng, 10, 20)}"})
            body = {"model": a.model, "messages": messages, "max_tokens": a.max_tokens, "stop": ["\n"],
                    "stream": True, "user": conv_id}
            meta = {"client": cid, "conv": conv_id, "prompt": p, "turn": turn + 1}
            if a.session_header:
                meta["headers"] = {a.session_header: conv_id}
            out = await run.request(body, meta)
            if not out["ok"]:
                break  # a conversation whose turn failed is abandoned, as a user would
            messages.append({"role": "assistant", "content": out["content"] or "..."})


async def mixed_client(run: Run, cid: int):
    a = run.a
    rng = random.Random(f"mixed-{a.seed}-{cid}")
    n = 0
    while run.more():
        long = rng.random() < a.long_share
        stream = rng.random() < a.stream_share
        words = a.long_words if long else rng.randint(20, 60)
        prompt = f"Request {cid}-{n}. {text(rng, words)}\nSummarise the text above in one sentence."
        n += 1
        body = {"model": a.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": a.max_tokens, "stop": ["\n"], "stream": stream}
        await run.request(body, {"client": cid, "kind": "long" if long else "short"})


def summarize(records, duration):
    ok = [r for r in records if r["status"] == 200]
    statuses = {}
    for r in records:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    ttft = [r["ttft"] for r in ok if r.get("ttft") is not None]
    total = [r["total"] for r in ok]
    out_tokens = sum(r.get("out_tokens") or r.get("chunks") or 0 for r in ok)

    def ms(x):
        return None if x is None else round(x * 1000, 1)

    return {
        "requests": len(records), "ok": len(ok),
        "success_rate": round(len(ok) / len(records), 4) if records else None,
        "statuses": statuses,
        "completed_per_s": round(len(ok) / duration, 3),
        "out_tokens_per_s": round(out_tokens / duration, 2),
        "ttft_n": len(ttft), "ttft_p50_ms": ms(pct(ttft, 50)), "ttft_p99_ms": ms(pct(ttft, 99)),
        "total_p50_ms": ms(pct(total, 50)), "total_p99_ms": ms(pct(total, 99)),
        "empty_streams": sum(1 for r in ok if r["stream"] and r.get("ttft") is None),
        "prompt_tokens": sum(r.get("prompt_tokens") or 0 for r in ok),
        "cached_tokens": sum(r.get("cached_tokens") or 0 for r in ok),
        "usage_missing": sum(1 for r in ok if "prompt_tokens" not in r),
    }


async def main_async(a):
    run = Run(a)
    extra = {}
    if a.mode == "affinity":
        prompts = system_prompts(a.seed, a.prompts, a.prompt_words_min, a.prompt_words_max)
        if a.tokenize_url:
            counts = []
            for p in prompts:
                req = urllib.request.Request(a.tokenize_url, data=json.dumps({"content": p}).encode(),
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=30) as r:
                        counts.append(len(json.load(r)["tokens"]))
                except Exception:  # noqa: BLE001 - informational only
                    counts.append(None)
            extra["system_prompt_tokens"] = counts
        tasks = [asyncio.create_task(affinity_client(run, i, prompts)) for i in range(a.clients)]
    else:
        tasks = [asyncio.create_task(mixed_client(run, i)) for i in range(a.clients)]

    async def at(t):
        await asyncio.sleep(max(0.0, t - time.monotonic()))

    await at(run.window_start)
    before = await asyncio.gather(*(asyncio.to_thread(scrape, u) for u in a.metrics_url))
    await at(run.window_end)
    after = await asyncio.gather(*(asyncio.to_thread(scrape, u) for u in a.metrics_url))
    cut_off = run.in_window_started - len(run.records)
    in_flight = run.started - run.finished
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in run.clients:
        await c.close()

    servers = []
    for u, b, e in zip(a.metrics_url, before, after):
        s = {"metrics_url": u}
        if "error" in b or "error" in e:
            s["error"] = b.get("error") or e.get("error")
        else:
            s["delta"] = {k.split(":", 1)[1]: e[k] - b[k] for k in e if k in b and k.endswith("_total")}
        servers.append(s)
    summary = summarize(run.records, a.duration)
    summary["cut_off"] = max(0, cut_off)
    summary["in_flight_at_end"] = in_flight
    summary["started_total"] = run.started
    summary["llamacpp_prompt_tokens"] = sum(s.get("delta", {}).get("prompt_tokens_total", 0) for s in servers)
    summary["llamacpp_prompt_tokens_cached"] = sum(
        s.get("delta", {}).get("prompt_tokens_cached_total", 0) for s in servers)
    summary["llamacpp_tokens_predicted"] = sum(
        s.get("delta", {}).get("tokens_predicted_total", 0) for s in servers)
    return {"mode": a.mode, "clients": a.clients, "duration_s": a.duration, "warmup_s": a.warmup,
            "summary": summary, "servers": servers, **extra, "requests": run.records}


def main():
    ap = argparse.ArgumentParser(description="bench/llamacpp load client (see the module doc)")
    ap.add_argument("mode", choices=["affinity", "mixed"])
    ap.add_argument("--url", action="append", required=True,
                    help="OpenAI base URL (with /v1); several: client-side round robin")
    ap.add_argument("--metrics-url", action="append", default=[], help="a llama.cpp server's /metrics")
    ap.add_argument("--tokenize-url", help="a llama.cpp server's /tokenize, to report prompt sizes")
    ap.add_argument("--api-key", default="sk-bench-0000")
    ap.add_argument("--model", default="gemma")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--timeout", type=float, default=120.0, help="per request, seconds")
    ap.add_argument("--max-requests", type=int, default=100000, help="a bound on requests started")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=4, help="affinity: distinct system prompts")
    ap.add_argument("--prompt-words-min", type=int, default=900)
    ap.add_argument("--prompt-words-max", type=int, default=1250)
    ap.add_argument("--turns-min", type=int, default=3)
    ap.add_argument("--turns-max", type=int, default=4)
    ap.add_argument("--session-header", default="x-session-id",
                    help="affinity: header carrying the conversation id ('' for none)")
    ap.add_argument("--error-pause", type=float, default=1.0,
                    help="seconds a client waits after a failed request before its next one")
    ap.add_argument("--keepalive", action="store_true",
                    help="reuse connections (off by default: see http_client())")
    ap.add_argument("--long-share", type=float, default=0.3, help="mixed: share of long prompts")
    ap.add_argument("--long-words", type=int, default=900, help="mixed: words in a long prompt")
    ap.add_argument("--stream-share", type=float, default=0.5, help="mixed: share of streaming requests")
    a = ap.parse_args()
    for u in a.url + a.metrics_url + ([a.tokenize_url] if a.tokenize_url else []):
        if not u.startswith(("http://127.0.0.1:", "http://localhost:")):
            raise SystemExit(f"loopback only: {u}")
    if a.clients < 1 or a.duration <= 0 or a.warmup < 0 or a.turns_min > a.turns_max:
        raise SystemExit("need --clients >= 1, --duration > 0, --warmup >= 0, --turns-min <= --turns-max")
    result = asyncio.run(main_async(a))
    print("JSON:" + json.dumps(result, separators=(",", ":")), flush=True)
    s = result["summary"]
    print(f"{a.mode} clients={a.clients}: {s['ok']}/{s['requests']} ok, {s['completed_per_s']} req/s, "
          f"ttft p50/p99 {s['ttft_p50_ms']}/{s['ttft_p99_ms']} ms, statuses {s['statuses']}, "
          f"llama.cpp prompt tokens {s['llamacpp_prompt_tokens']:.0f} (cached {s['llamacpp_prompt_tokens_cached']:.0f})",
          file=sys.stderr)


if __name__ == "__main__":
    main()
