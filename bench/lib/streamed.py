#!/usr/bin/env python3
"""The benchmark's request asking for a streamed answer: REQUEST_JSON with `"stream": true`, on
stdout. Used by run.sh (the SSE runs) and lib/loads.sh (the streamed load bolt.sh and pgo.sh profile).

Usage: streamed.py REQUEST_JSON
"""
import json
import sys

request = json.load(open(sys.argv[1]))
request["stream"] = True
print(json.dumps(request))
