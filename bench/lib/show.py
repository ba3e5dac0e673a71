#!/usr/bin/env python3
"""Print one progress line for a wrk or sse result (argv: wrk|sse TARGET LABEL JSON)."""
import json
import sys

kind, target, label, raw = sys.argv[1:5]
r = json.loads(raw)
if kind == "wrk":
    sock = r["err_connect"] + r["err_read"] + r["err_write"] + r["err_timeout"]
    print(f"  {target:8} c={label:>3} rps={r['rps']:>9.0f} p50={r['lat_p50_us']:>6}us "
          f"p99={r['lat_p99_us']:>6}us non2xx={r['err_status']} sockerr={sock}")
else:
    print(f"  {target:8} sse-{label:4} streams={r['streams']} ttft p50={r['ttft_p50_us']}us "
          f"total p50={r['total_p50_us']}us p99={r['total_p99_us']}us "
          f"events={r['events_min']}-{r['events_max']} errors={sum(r['errors'].values())}")
