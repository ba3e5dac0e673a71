#!/usr/bin/env python3
"""Turn one raw result of bench/run.sh (results/raw/<ts>.json) into markdown.

Usage: summarize.py RAW.json [--out results/latest.md]   (stdout without --out)

Every NGINX and SPILLWAY run is compared with the DIRECT run of the same
repetition and concurrency (measured in the same minute). Each figure in the
tables is the median over repetitions; error counts are summed. The same-run table
also gives SPILLWAY's req/s over NGINX's for each repetition on its own.
"""
import argparse
import json
import os
import statistics

LABEL = {"direct": "DIRECT", "nginx": "NGINX", "spillway": "SPILLWAY"}
ORDER = ["direct", "nginx", "spillway"]


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt_us(v):
    if v is None:
        return "–"
    if abs(v) >= 10000:
        return f"{v / 1000:.1f} ms"
    if abs(v) >= 1000:
        return f"{v / 1000:.2f} ms"
    return f"{v:.0f} µs"


def fmt_add(v):
    if v is None:
        return "–"
    return ("+" if v >= 0 else "−") + fmt_us(abs(v))


def fmt(v, spec, dash="–"):
    return dash if v is None else format(v, spec)


def delta(run, group, key="cpu_s"):
    b, a = run.get("before") or {}, run.get("after") or {}
    if group in b and group in a and a[group].get("nproc") and b[group].get("nproc"):
        return a[group][key] - b[group][key]
    return None


def util(run):
    b, a = run.get("before") or {}, run.get("after") or {}
    try:
        dt = a["sys_total_s"] - b["sys_total_s"]
        return (a["sys_busy_s"] - b["sys_busy_s"]) / dt if dt > 0 else None
    except KeyError:
        return None


def wrk_runs(runs):
    """The wrk runs that have a result."""
    return [r for r in runs if r["kind"] == "wrk" and r.get("res")]


def wrk_rows(runs):
    """{conns: {target: aggregated dict}}"""
    out = {}
    wrk = wrk_runs(runs)
    for c in sorted({r["conns"] for r in wrk}):
        per_target = {}
        for t in ORDER:
            rows = []
            for rep in sorted({r["rep"] for r in wrk if r["conns"] == c}):
                d = [r for r in wrk if r["conns"] == c and r["rep"] == rep and r["target"] == "direct"]
                p = [r for r in wrk if r["conns"] == c and r["rep"] == rep and r["target"] == t]
                if not p:
                    continue
                p = p[0]
                pr = p["res"]
                dr = d[0]["res"] if d else None
                n = pr["requests"]
                el = pr["duration_us"] / 1e6
                gw = delta(p, t) if t != "direct" else None
                be = delta(p, "backend")
                up = p.get("upstream") or {}
                sock = pr["err_connect"] + pr["err_read"] + pr["err_write"] + pr["err_timeout"]
                rows.append({
                    "rps": pr["rps"], "p50": pr["lat_p50_us"], "p99": pr["lat_p99_us"],
                    "ratio": pr["rps"] / dr["rps"] if dr and dr["rps"] else None,
                    "add_p50": pr["lat_p50_us"] - dr["lat_p50_us"] if dr else None,
                    "add_p99": pr["lat_p99_us"] - dr["lat_p99_us"] if dr else None,
                    "gw_us_req": gw / n * 1e6 if gw is not None and n else None,
                    "gw_cores": gw / el if gw is not None and el else None,
                    "be_us_req": be / n * 1e6 if be is not None and n else None,
                    "busy": util(p),
                    "up_estab": up.get("estab_owned") if t != "direct" else None,
                    "up_tw": up.get("time_wait"),
                    "non2xx": pr["err_status"], "sock": sock, "requests": n,
                })
            if rows:
                agg = {k: med([r[k] for r in rows]) for k in rows[0] if k not in ("non2xx", "sock", "requests")}
                agg["non2xx"] = sum(r["non2xx"] for r in rows)
                agg["sock"] = sum(r["sock"] for r in rows)
                agg["requests"] = sum(r["requests"] for r in rows)
                agg["reps"] = len(rows)
                per_target[t] = agg
        out[c] = per_target
    return out


def head_to_head(runs):
    """{conns: [SPILLWAY req/s / NGINX req/s, one per repetition]}: the two paths of one
    repetition ran back to back, so each quotient compares like with like, and their spread
    within a run shows how far one run's median can be trusted."""
    wrk = wrk_runs(runs)
    out = {}
    for c in sorted({r["conns"] for r in wrk}):
        quotients = []
        for rep in sorted({r["rep"] for r in wrk if r["conns"] == c}):
            rps = {r["target"]: r["res"]["rps"] for r in wrk if r["conns"] == c and r["rep"] == rep}
            if rps.get("nginx") and rps.get("spillway"):
                quotients.append(rps["spillway"] / rps["nginx"])
        out[c] = quotients
    return out


def sse_rows(runs):
    out = {}
    sse = [r for r in runs if r["kind"] == "sse" and r.get("res")]
    for mode in ("seq", "conc"):
        per_target = {}
        for t in ORDER:
            rows = []
            for rep in sorted({r["rep"] for r in sse if r["mode"] == mode}):
                d = [r for r in sse if r["mode"] == mode and r["rep"] == rep and r["target"] == "direct"]
                p = [r for r in sse if r["mode"] == mode and r["rep"] == rep and r["target"] == t]
                if not p:
                    continue
                p = p[0]
                pr = p["res"]
                dr = d[0]["res"] if d else None

                def add(k):
                    if not dr or pr.get(k) is None or dr.get(k) is None:
                        return None
                    return pr[k] - dr[k]
                gw = delta(p, t) if t != "direct" else None
                rows.append({
                    "sps": pr["streams_per_s"], "ttft50": pr["ttft_p50_us"], "ttft99": pr["ttft_p99_us"],
                    "tot50": pr["total_p50_us"], "tot99": pr["total_p99_us"],
                    "add_ttft50": add("ttft_p50_us"), "add_tot50": add("total_p50_us"),
                    "gw_us_stream": gw / pr["streams"] * 1e6 if gw is not None and pr["streams"] else None,
                    "ev_min": pr.get("events_min"), "ev_max": pr.get("events_max"),
                    "errors": sum(pr["errors"].values()), "streams": pr["streams"],
                })
            if rows:
                agg = {k: med([r[k] for r in rows]) for k in rows[0] if k not in ("errors", "streams", "ev_min", "ev_max")}
                agg["ev_min"] = min((r["ev_min"] for r in rows if r["ev_min"] is not None), default=None)
                agg["ev_max"] = max((r["ev_max"] for r in rows if r["ev_max"] is not None), default=None)
                agg["errors"] = sum(r["errors"] for r in rows)
                agg["streams"] = sum(r["streams"] for r in rows)
                agg["reps"] = len(rows)
                per_target[t] = agg
        if per_target:
            out[mode] = per_target
    return out


def parse_prom(text):
    """Prometheus text format -> {"name{labels}": value} (comments and blank lines skipped)."""
    out = {}
    for ln in text.splitlines():
        if not ln or ln.startswith("#"):
            continue
        key, _, val = ln.rpartition(" ")
        try:
            out[key.strip()] = float(val)
        except ValueError:
            continue
    return out


def render(doc, raw_name):
    m = doc["meta"]
    runs = doc["runs"]
    L = []
    L.append(f"# spillway overhead on loopback — {m['date_start_utc'][:10]}\n")
    L.append(f"Generated by `bench/run.sh` (`bench/lib/summarize.py`) from `bench/results/raw/{raw_name}` "
             "(git-ignored). Method and caveats: `bench/README.md`.\n")
    L.append("**Read with care:** one machine, 2 cores shared by wrk (1 thread), the mock backend (nginx, 1 worker) "
             "and the gateway, so absolute req/s are capped and noisy. Compare the ratios against DIRECT from the "
             "same minute and the gateway's CPU µs per request.\n")
    if m.get("spillway_skipped"):
        L.append(f"**SPILLWAY was not measured:** {m['spillway_skipped']}.\n")
    if m.get("spillway_died"):
        L.append(f"**SPILLWAY crashed:** {m['spillway_died']}.\n")

    v = m.get("versions", {})
    mem = (m.get("mem_total_kb") or 0) / 1024 / 1024
    L.append("## Run\n")
    L.append("| | |")
    L.append("|---|---|")
    L.append(f"| date (UTC) | {m['date_start_utc']} → {m['date_end_utc'][11:]} |")
    L.append(f"| machine | {m['nproc']} CPUs ({m.get('cpu_model')}), {mem:.1f} GiB memory, kernel {m['kernel']} |")
    L.append(f"| load average (1/5/15 min) | start {m['loadavg_start']} → end {m['loadavg_end']} |")
    L.append(f"| network | {'private network namespace with loopback only (unshare -n)' if m.get('isolated_netns') else 'host namespace, 127.0.0.1 only'} |")
    L.append(f"| load generator | `{m['wrk_cmd']}`, C = {', '.join(map(str, m['conns']))}; {m['reps']} repetition(s); "
             f"{m['warmup_s']} s warm-up per path, not recorded |")
    L.append(f"| order | per repetition and concurrency, paths back to back: odd repetitions {' → '.join(LABEL[t] for t in m['paths_measured'])}, even ones reversed |")
    L.append(f"| nginx | {v.get('nginx')} (libnginx-mod-http-lua {v.get('libnginx-mod-http-lua')}) |")
    L.append(f"| wrk / python | {v.get('wrk')} / {v.get('python')} |")
    L.append(f"| spillway | {v.get('spillway') or '–'}; repo at {v.get('repo_commit')}; `{m.get('spillway_cmd')}` |")
    L.append("")

    W = wrk_rows(runs)
    L.append("## Non-streaming `POST /v1/chat/completions` (wrk, closed loop)\n")
    L.append("× direct = req/s ÷ DIRECT req/s of the same repetition; added = path − DIRECT latency. "
             "gw CPU = utime+stime of the gateway's processes during the run. "
             "Upstream conns, sampled mid-run: ESTABLISHED connections from the gateway to the backend (its pool, idle ones "
             "included) / all TIME-WAIT connections to the backend port (a few dozen linger from earlier runs; "
             "thousands would mean no connection reuse). CPU times come from /proc in 10 ms ticks.\n")
    L.append("| path | conns | req/s | × direct | p50 | p99 | added p50 | added p99 | gw CPU µs/req | gw CPU (cores) | backend CPU µs/req | machine CPU busy | upstream conns (estab / time-wait) | non-2xx / socket errors | reps |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c, per in W.items():
        for t in ORDER:
            r = per.get(t)
            if not r:
                continue
            direct = t == "direct"
            L.append(f"| {LABEL[t]} | {c} | {r['rps']:,.0f} | {'1' if direct else fmt(r['ratio'], '.3f')} | "
                     f"{fmt_us(r['p50'])} | {fmt_us(r['p99'])} | "
                     f"{'' if direct else fmt_add(r['add_p50'])} | {'' if direct else fmt_add(r['add_p99'])} | "
                     f"{'' if direct else fmt(r['gw_us_req'], '.1f')} | {'' if direct else fmt(r['gw_cores'], '.2f')} | "
                     f"{fmt(r['be_us_req'], '.1f')} | {fmt(None if r['busy'] is None else 100 * r['busy'], '.0f')}% | "
                     f"{'' if direct else fmt(r['up_estab'], '.0f') + ' / ' + fmt(r['up_tw'], '.0f')} | {r['non2xx']} / {r['sock']} | {r['reps']} |")
    L.append("")

    # compact comparison: spillway vs nginx
    if any("spillway" in per and "nginx" in per for per in W.values()):
        L.append("### SPILLWAY vs NGINX (same run)\n")
        H = head_to_head(runs)
        L.append("| conns | × direct: NGINX / SPILLWAY | SPILLWAY ÷ NGINX req/s, each repetition | added p50: NGINX / SPILLWAY | added p99: NGINX / SPILLWAY | CPU µs/req: NGINX / SPILLWAY (ratio) |")
        L.append("|---:|---|---|---|---|---|")
        for c, per in W.items():
            n, s = per.get("nginx"), per.get("spillway")
            if not n or not s:
                continue
            cr = s["gw_us_req"] / n["gw_us_req"] if s["gw_us_req"] and n["gw_us_req"] else None
            q = H.get(c) or []
            each = ", ".join(f"{x:.2f}" for x in q) + f" (≥ 1 in {sum(x >= 1 for x in q)} of {len(q)})" if q else "–"
            L.append(f"| {c} | {fmt(n['ratio'], '.3f')} / {fmt(s['ratio'], '.3f')} | {each} | {fmt_add(n['add_p50'])} / {fmt_add(s['add_p50'])} | "
                     f"{fmt_add(n['add_p99'])} / {fmt_add(s['add_p99'])} | {fmt(n['gw_us_req'], '.1f')} / {fmt(s['gw_us_req'], '.1f')} ({fmt(cr, '.1f')}×) |")
        L.append("")

    S = sse_rows(runs)
    if S:
        sm = m.get("sse", {})
        L.append("## Streaming (SSE)\n")
        L.append(f"The mock sends 20 `data:` chunk events and `data: [DONE]`, waiting {sm.get('mock_delay_ms')} ms between events "
                 f"(about {20 * (sm.get('mock_delay_ms') or 0):.0f} ms per stream). `seq` = {sm.get('seq_n')} sequential streams on one "
                 f"connection; `conc` = {sm.get('conc')} concurrent streams for {sm.get('conc_duration_s')} s. TTFT = request sent → "
                 "first bytes containing `data:`; a path that buffered the stream would show TTFT ≈ total.\n")
        L.append("| path | mode | streams | streams/s | TTFT p50 | TTFT p99 | added TTFT p50 | total p50 | total p99 | added total p50 | gw CPU µs/stream | data: events per stream | errors | reps |")
        L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for mode, per in S.items():
            for t in ORDER:
                r = per.get(t)
                if not r:
                    continue
                direct = t == "direct"
                ev = f"{r['ev_min']}" if r["ev_min"] == r["ev_max"] else f"{r['ev_min']}–{r['ev_max']}"
                L.append(f"| {LABEL[t]} | {mode} | {r['streams']} | {fmt(r['sps'], '.1f')} | {fmt_us(r['ttft50'])} | {fmt_us(r['ttft99'])} | "
                         f"{'' if direct else fmt_add(r['add_ttft50'])} | {fmt_us(r['tot50'])} | {fmt_us(r['tot99'])} | "
                         f"{'' if direct else fmt_add(r['add_tot50'])} | {'' if direct else fmt(r['gw_us_stream'], '.0f')} | {ev} | {r['errors']} | {r['reps']} |")
        L.append("")

    L.append("## Memory\n")
    L.append("| process tree | processes | RSS idle (before the runs) | peak RSS (VmHWM, summed) at the end |")
    L.append("|---|---:|---:|---:|")
    for g, label in (("nginx", "NGINX proxy"), ("spillway", "SPILLWAY"), ("backend", "mock backend")):
        i, f = (m.get("idle") or {}).get(g) or {}, (m.get("final") or {}).get(g) or {}
        if not f.get("nproc"):
            continue
        L.append(f"| {label} | {f['nproc']} | {i.get('rss_kb_sum', 0) / 1024:.1f} MiB | {f.get('hwm_kb_sum', 0) / 1024:.1f} MiB |")
    L.append("")

    L.append("## Checks\n")
    for ch in m.get("checks", []):
        L.append(f"- {LABEL.get(ch['path'], ch['path'])} {ch['check']}: {'ok' if ch['ok'] else 'FAILED'} — {ch['detail']}")
    mt = m.get("spillway_metrics_after")
    if mt is not None:
        after = parse_prom(mt)
        before = parse_prom(m.get("spillway_metrics_before") or "")
        L.append(f"- SPILLWAY `/metrics` after the runs: {len(after)} samples")
        counters = [(k, v - before.get(k, 0.0)) for k, v in after.items() if k.split("{")[0].endswith("_total")]
        if counters:
            L.append("")
            L.append("SPILLWAY counters: increase from just after the sanity checks to the end of the run (includes "
                     "the warm-up and the SSE streams). Compare with the requests sent:\n")
            L.append("| counter | increase |")
            L.append("|---|---:|")
            for k, dv in sorted(counters):
                L.append(f"| `{k}` | {dv:,.0f} |")
            sent = sum(r["res"]["requests"] for r in runs if r["kind"] == "wrk" and r["target"] == "spillway" and r.get("res"))
            streams = sum(r["res"]["streams"] for r in runs if r["kind"] == "sse" and r["target"] == "spillway" and r.get("res"))
            L.append(f"\nRecorded through SPILLWAY: {sent:,} non-streaming requests in the measured wrk runs "
                     f"(warm-up not included) and {streams:,} streams.")
    if m.get("spillway_skipped"):
        L.append(f"- SPILLWAY skipped: {m['spillway_skipped']}")
    L.append("")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("--out")
    a = ap.parse_args()
    doc = json.load(open(a.raw))
    md = render(doc, os.path.basename(a.raw))
    if a.out:
        with open(a.out, "w") as f:
            f.write(md)
    else:
        print(md)


if __name__ == "__main__":
    main()
