"""Starts a mock backend and a gateway as real processes on 127.0.0.1 for the SDK tests."""

import hashlib
import os
import pathlib
import subprocess
import tempfile
import threading
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
KEY = "sk-python-sdk-test"


def binary() -> str:
    path = os.environ.get("SPILLWAY_BIN", str(ROOT / "target" / "debug" / "spillway"))
    if not os.path.exists(path):
        pytest.fail(f"spillway binary not found at {path}: build it with `cargo build` or set SPILLWAY_BIN")
    return path


class Proc:
    """A spillway process that printed its address; killed at teardown."""

    def __init__(self, args, env=None):
        self.proc = subprocess.Popen(
            [binary(), *args],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "SPILLWAY_LOG": "warn", **(env or {})},
        )
        found = threading.Event()
        self.addrs = []

        def read():
            for line in self.proc.stdout:
                if not found.is_set() and "http://" in line:
                    self.addrs = [part.split()[0].rstrip(")") for part in line.split("http://")[1:]]
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(30):
            self.stop()
            pytest.fail(f"spillway {args} did not report its address")
        self.url = "http://" + self.addrs[0]

    def stop(self):
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture(scope="session")
def mock_backend():
    p = Proc(["mock-backend", "--listen", "127.0.0.1:0", "--model", "sdk-model", "--ttft", "10ms",
              "--tokens-per-sec", "200", "--max-output-tokens", "12"])
    yield p
    p.stop()


@pytest.fixture(scope="session")
def gateway(mock_backend, tmp_path_factory):
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    store_path = tmp_path_factory.mktemp("store") / "spillway.db"
    config = f"""
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[store]
url = "sqlite://{store_path}"

[[tenants]]
name = "sdk"
keys = [{{ sha256 = "{digest}" }}]
# Where a Responses create that names no model goes.
default_model = "sdk-model"

[[models]]
name = "sdk-model"
[[models.backends]]
name = "mock"
url = "{mock_backend.url}/v1"
# A standalone server under kind "openai" keeps completions only if it says so.
surfaces = ["chat", "completions", "embeddings", "responses", "messages", "stored_chat"]

# Every stream of this model breaks off after two chunks.
[[models]]
name = "broken-model"
[[models.backends]]
name = "breaks"
kind = "mock"
mock = {{ ttft = "0ms", tokens_per_sec = 0.0, fault = {{ break_stream_after = 2 }} }}

# Every backend of this model is out of capacity.
[[models]]
name = "full-model"
[[models.backends]]
name = "full"
kind = "mock"
mock = {{ fault = {{ error_rate = 1.0, error_status = 503 }} }}
"""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(config)
    p = Proc(["serve", "--config", f.name])
    yield p
    p.stop()
    os.unlink(f.name)


def wait_for(predicate, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")
