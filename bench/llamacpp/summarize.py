#!/usr/bin/env python3
"""bench/llamacpp raw JSON -> markdown tables (results/llamacpp.md). See bench/README.md."""

import argparse
import json
import os


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * len(xs) + 0.5)) - 1))
    return xs[k]


def ms(v):
    if v is None:
        return "–"
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.0f} ms"


def num(v, digits=0):
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def statuses(d):
    return ", ".join(f"{k}: {v}" for k, v in sorted(d.items(), key=lambda kv: (kv[0] != "200", kv[0]))) or "–"


def errors(d):
    return ", ".join(f"{k}: {v}" for k, v in sorted(d.items()) if k != "200") or "none"


def server_deltas(r, name):
    vals = [s.get("delta", {}).get(name) for s in r.get("servers", [])]
    return " / ".join("?" if v is None else f"{v:,.0f}" for v in vals)


COUNTERS = ("spillway_upstream_errors_total", "spillway_retries_total", "spillway_streams_broken_total",
            "spillway_backend_concurrency_limit")


def spillway_counters(runs, label):
    """Non-zero upstream error, retry and broken-stream counters and the adaptive limits at the end."""
    out = []
    for run in runs:
        text = run.get("spillway_metrics")
        if not text:
            continue
        seen = []
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if name.startswith(COUNTERS) and value not in ("0", "0.0"):
                seen.append(f"`{name.replace('spillway_', '', 1)}` {value}")
        out.append(f"* {label(run)}: " + ("; ".join(seen) or "no upstream errors, retries or broken streams"))
    if out:
        out = ["spillway's own counters at the end of each run (non-zero only; the concurrency limit is the "
               "adaptive one, per backend):", "", *out, ""]
    return out


def affinity_rows(runs):
    out = [
        "| clients | balance | ok / recorded | req/s | output tok/s | TTFT p50 | TTFT p99 | total p50 | total p99 "
        "| prompt tokens computed (llama-1 / llama-2) | computed per ok request | prompt tokens cached "
        "| cache hit (usage) | errors by status | cut off |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for run in runs:
        mode = run["mode"] if run["mode"] != "default" else "(key left out)"
        if run.get("skipped") or not run.get("result"):
            out.append(f"| {run['clients']} | {mode} | skipped: {run.get('skipped')} |" + " |" * 12)
            continue
        s = run["result"]["summary"]
        per = s["llamacpp_prompt_tokens"] / s["ok"] if s["ok"] else None
        hit = f"{100 * s['cached_tokens'] / s['prompt_tokens']:.1f} %" if s["prompt_tokens"] else "–"
        died = f" ({run['died']})" if run.get("died") else ""
        out.append(
            f"| {run['clients']} | {mode}{died} | {s['ok']} / {s['requests']} | {s['completed_per_s']:.2f} "
            f"| {s['out_tokens_per_s']:.1f} | {ms(s['ttft_p50_ms'])} | {ms(s['ttft_p99_ms'])} "
            f"| {ms(s['total_p50_ms'])} | {ms(s['total_p99_ms'])} "
            f"| {num(s['llamacpp_prompt_tokens'])} ({server_deltas(run['result'], 'prompt_tokens_total')}) "
            f"| {num(per)} | {num(s['llamacpp_prompt_tokens_cached'])} | {hit} | {errors(s['statuses'])} | {s['cut_off']} |"
        )
    return out


def mixed_rows(runs):
    out = [
        "| path | clients | success rate | ok / recorded | statuses | req/s | TTFT p50 (stream) | TTFT p99 (stream) "
        "| total p50 / p99 (non-stream) | short ok | long ok | output tok/s | cut off |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        path = "SPILLWAY" if run["path"] == "spillway" else "DIRECT (client-side round robin)"
        if run.get("skipped") or not run.get("result"):
            out.append(f"| {path} | {run['clients']} | skipped: {run.get('skipped')} |" + " |" * 10)
            continue
        r = run["result"]
        s = r["summary"]
        reqs = r["requests"]
        ns = [q["total"] * 1000 for q in reqs if q["status"] == 200 and not q["stream"]]

        def kind(k):
            all_ = [q for q in reqs if q.get("kind") == k]
            return f"{sum(1 for q in all_ if q['status'] == 200)} / {len(all_)}"

        rate = f"{100 * s['success_rate']:.1f} %" if s["success_rate"] is not None else "–"
        died = f" ({run['died']})" if run.get("died") else ""
        out.append(
            f"| {path}{died} | {run['clients']} | {rate} | {s['ok']} / {s['requests']} | {statuses(s['statuses'])} "
            f"| {s['completed_per_s']:.2f} | {ms(s['ttft_p50_ms'])} | {ms(s['ttft_p99_ms'])} "
            f"| {ms(pct(ns, 50))} / {ms(pct(ns, 99))} | {kind('short')} | {kind('long')} "
            f"| {s['out_tokens_per_s']:.1f} | {s['cut_off']} |"
        )
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    d = json.load(open(a.raw))
    m, runs = d["meta"], d["runs"]
    L = m["llamacpp"]
    aff = [r for r in runs if r["part"] == "affinity"]
    mix = [r for r in runs if r["part"] == "mixed"]
    prompt_tokens = next((r["result"].get("system_prompt_tokens") for r in aff if r.get("result")), None)
    lines = [
        f"# spillway in front of two llama.cpp servers — {m['date_start_utc'][:10]}",
        "",
        f"Generated by `bench/llamacpp/run.sh` (`bench/llamacpp/summarize.py`) from "
        f"`bench/results/raw/{os.path.basename(a.raw)}` (git-ignored). Method and caveats: `bench/README.md` "
        "(section bench/llamacpp).",
        "",
        "## Run",
        "",
        "| | |",
        "|---|---|",
        f"| date (UTC) | {m['date_start_utc']} → {m['date_end_utc']} |",
        f"| machine | {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_total_kb'] / 1048576:.1f} GiB memory, kernel {m['kernel']} |",
        f"| load average (1/5/15 min) | start {m['loadavg_start']} → end {m['loadavg_end']} |",
        f"| network | {'private network namespace with loopback only (unshare -n)' if m['isolated_netns'] else 'host namespace, 127.0.0.1 only'} |",
        f"| llama.cpp | 2 servers (`tests/llamacpp/serve.py`, Gemma 3 270M Q4_K_M), each {L['slots']} slots, "
        f"n_ctx {L['ctx']} ({L['ctx'] // L['slots']} per slot), {L['threads']} thread(s), host prompt cache "
        f"{L['cache_ram_mib']} MiB; started fresh for every run |",
        f"| spillway | {m['versions']['spillway']}; `max_concurrency = {m['spillway_max_concurrency']}` per backend; "
        f"repo at {m['versions']['repo_commit']} |",
        f"| client | `bench/llamacpp/client.py` ({m['versions']['python_packages']}): AsyncOpenAI, max_retries=0, "
        f"timeout {m['request_timeout_s']} s, a new connection per request, `max_tokens` {m['max_tokens']}, "
        f"`stop: [\"\\n\"]`, seed {m['seed']} |",
        "",
    ]
    if aff:
        lines += [
            "## Prefix affinity vs least load vs round robin (part a)",
            "",
            f"Multi-turn conversations (3-4 turns, streaming) over {len(prompt_tokens) if prompt_tokens else '?'} "
            f"shared system prompts of {', '.join(str(t) for t in prompt_tokens) if prompt_tokens else '?'} tokens, "
            f"through spillway; {m['warmup_s']} s warm-up, then {m['duration_s']} s measured per run. "
            "Recorded: requests that started after the warm-up and ended within the window; *cut off*: "
            "started in the window, still running at its end. TTFT = request sent → first content chunk. "
            "*prompt tokens computed* = rise of `llamacpp:prompt_tokens_total` over the window (prefill "
            "llama.cpp actually ran; it counts a request's prompt when its prefill is done, not while it runs), "
            "*cached* = rise of `llamacpp:prompt_tokens_cached_total`; *cache hit (usage)* = cached ÷ prompt "
            "tokens in the `usage` of the recorded requests.",
            "",
            *affinity_rows(aff),
            "",
            *spillway_counters(aff, lambda r: f"{r['clients']} clients, balance {r['mode']}"),
        ]
    if mix:
        mm = m["mixed"]
        lines += [
            "## Mixed load: spillway vs direct (part b)",
            "",
            f"{mm['clients']} clients, closed loop, {mm['warmup_s']} s warm-up then {mm['duration_s']} s measured: "
            f"30 % long prompts ({mm.get('long_words', m.get('long_words', '?'))} words, unique, so no cache helps), "
            "70 % short (20-60 words); half "
            "streaming. DIRECT sends alternately to the two servers (the same capacity as spillway's pool); "
            "SPILLWAY uses spillway's default balancing. Success rate = 200s ÷ recorded requests.",
            "",
            *mixed_rows(mix),
            "",
            *spillway_counters(mix, lambda r: "SPILLWAY"),
        ]
    open(a.out, "w").write("\n".join(lines))


if __name__ == "__main__":
    main()
