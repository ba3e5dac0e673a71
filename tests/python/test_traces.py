"""spillway's OpenTelemetry traces, received over OTLP/HTTP by a small collector built on the
official opentelemetry-proto package, with the official openai SDK as the caller.

The model has two backends in turn: one that answers 502 to everything and records the
`traceparent` it is sent, and a mock that serves. So some calls are retried, and the test can
follow the trace from the caller's `traceparent`, through the call's span and each attempt's,
to what the failing backend received."""

import hashlib
import os
import pathlib
import subprocess
import http.server
import json
import secrets
import threading
import urllib.request

import openai
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from conftest import Proc, wait_for

KEY = "sk-trace-test-key-never-in-a-span"
SERVER = trace_pb2.Span.SPAN_KIND_SERVER
CLIENT = trace_pb2.Span.SPAN_KIND_CLIENT


class Listener:
    """An HTTP server on 127.0.0.1 in a thread; `handle(handler)` answers each POST."""

    def __init__(self, handle):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                status, content_type, payload = handle(self, body)
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


class Collector:
    """Receives OTLP/HTTP protobuf trace exports and keeps every span with its raw bytes."""

    def __init__(self):
        self.spans = []
        self.raw = []
        self.lock = threading.Lock()

        def handle(request, body):
            export = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            with self.lock:
                self.raw.append(body)
                for resource_spans in export.resource_spans:
                    for scope_spans in resource_spans.scope_spans:
                        self.spans.extend(scope_spans.spans)
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            return 200, "application/x-protobuf", reply

        self.listener = Listener(handle)
        self.url = self.listener.url

    def of_trace(self, trace_id: bytes):
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]


class FailingBackend:
    """Answers every request 502 (a gateway error, retried) and remembers the traceparent of each."""

    def __init__(self):
        self.traceparents = []

        def handle(request, body):
            self.traceparents.append(request.headers.get("traceparent"))
            error = {"error": {"message": "broken", "type": "server_error"}}
            return 502, "application/json", json.dumps(error).encode()

        self.listener = Listener(handle)
        self.url = self.listener.url


def attrs(span):
    out = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        if kind == "array_value":
            out[kv.key] = [x.string_value for x in v.array_value.values]
        else:
            out[kv.key] = getattr(v, kind)
    return out


def gateway(backends: str, telemetry: str, tmp_path):
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    config = f"""
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[store]
url = "sqlite://{tmp_path / 'spillway.db'}"

[telemetry]
{telemetry}

[[tenants]]
name = "traced"
keys = [{{ sha256 = "{digest}" }}]

[[models]]
name = "sdk-model"
balance = "round_robin"
{backends}
"""
    path = tmp_path / "spillway.toml"
    path.write_text(config)
    return Proc(["serve", "--config", str(path)])


def metric(gw, name):
    """The sum of a counter's series on the admin listener's /metrics."""
    page = urllib.request.urlopen("http://" + gw.addrs[1] + "/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
               if line.startswith(name) and not line.startswith("#"))


@pytest.fixture
def traced(mock_backend, tmp_path):
    collector = Collector()
    failing = FailingBackend()
    backends = f"""
[[models.backends]]
name = "failing"
url = "{failing.url}/v1"
[[models.backends]]
name = "mock"
url = "{mock_backend.url}/v1"
"""
    telemetry = f'otlp_endpoint = "{collector.url}/v1/traces"\nexport_interval = "100ms"'
    gw = gateway(backends, telemetry, tmp_path)
    yield gw, collector, failing
    gw.stop()
    collector.listener.stop()
    failing.listener.stop()


def test_spans_follow_the_callers_trace_through_retries_with_genai_attributes(traced):
    gw, collector, failing = traced
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0)
    calls = []
    for i in range(4):
        trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
        traceparent = f"00-{trace_id}-{parent_id}-01"
        if i % 2 == 0:
            reply = client.chat.completions.create(
                model="sdk-model", messages=[{"role": "user", "content": "hi"}],
                extra_headers={"traceparent": traceparent})
            assert reply.choices[0].message.content
        else:
            stream = client.chat.completions.create(
                model="sdk-model", messages=[{"role": "user", "content": "hi"}], stream=True,
                stream_options={"include_usage": True}, extra_headers={"traceparent": traceparent})
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        calls.append((bytes.fromhex(trace_id), bytes.fromhex(parent_id)))

    def complete(trace_id):
        spans = collector.of_trace(trace_id)
        return any(s.kind == SERVER for s in spans)

    wait_for(lambda: all(complete(t) for t, _ in calls), "every call's span exported", timeout=20)
    retried = 0
    for trace_id, parent_id in calls:
        spans = collector.of_trace(trace_id)
        [call] = [s for s in spans if s.kind == SERVER]
        attempts = sorted((s for s in spans if s.kind == CLIENT),
                          key=lambda s: attrs(s)["spillway.attempt"])
        # The call's span continues the caller's trace; every attempt is its child.
        assert call.parent_span_id == parent_id
        assert call.name == "chat sdk-model"
        assert attempts and all(a.parent_span_id == call.span_id for a in attempts)
        a = attrs(call)
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.request.model"] == "sdk-model"
        assert a["gen_ai.response.model"] == "sdk-model"
        assert a["gen_ai.usage.input_tokens"] > 0
        assert a["gen_ai.usage.output_tokens"] > 0
        assert a["gen_ai.response.finish_reasons"]
        assert a["spillway.tenant"] == "traced"
        assert a["http.response.status_code"] == 200
        assert [e.name for e in call.events] == ["admitted"]
        last = attrs(attempts[-1])
        assert last["spillway.backend"] == "mock"
        assert last["server.address"] == "127.0.0.1"
        assert last["gen_ai.response.model"] == "sdk-model"
        if len(attempts) > 1:
            retried += 1
            first = attrs(attempts[0])
            assert first["spillway.backend"] == "failing"
            assert first["http.response.status_code"] == 502
            assert first["error.type"] == "transient"
            assert "spillway.retry.reason" not in first
            assert last["spillway.retry.reason"] == "transient"
            # The failing backend was sent the attempt's own span as its parent.
            sent = f"00-{trace_id.hex()}-{attempts[0].span_id.hex()}-01"
            assert sent in failing.traceparents
    assert retried >= 1, "no call was retried: the test proves nothing about retries"
    # No key in any span, in any export.
    assert not any(KEY.encode() in raw for raw in collector.raw)
    assert metric(gw, "spillway_trace_spans_exported_total") >= len(calls) * 2


def test_a_collector_that_never_answers_costs_dropped_spans_not_requests(mock_backend, tmp_path):
    # A collector that takes connections and never answers: each export waits its timeout.
    stalled = Listener(lambda request, body: threading.Event().wait(30) or (200, "text/plain", b""))
    backends = f'[[models.backends]]\nname = "mock"\nurl = "{mock_backend.url}/v1"\n'
    telemetry = (f'otlp_endpoint = "{stalled.url}/v1/traces"\nexport_queue = 4\nexport_batch = 2\n'
                 'export_interval = "10ms"\nexport_timeout = "5s"')
    gw = gateway(backends, telemetry, tmp_path)
    try:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0)
        for _ in range(30):
            reply = client.chat.completions.create(
                model="sdk-model", messages=[{"role": "user", "content": "hi"}])
            assert reply.choices[0].message.content
        wait_for(lambda: metric(gw, 'spillway_trace_spans_dropped_total{reason="queue_full"}') > 0,
                 "spans dropped at the full queue")
    finally:
        gw.stop()
        stalled.stop()


def test_the_sampling_ratio_decides_for_new_traces_and_the_caller_for_its_own(
        mock_backend, tmp_path):
    collector = Collector()
    backends = f'[[models.backends]]\nname = "mock"\nurl = "{mock_backend.url}/v1"\n'
    telemetry = (f'otlp_endpoint = "{collector.url}/v1/traces"\nsampling_ratio = 0.0\n'
                 'export_interval = "50ms"')
    gw = gateway(backends, telemetry, tmp_path)
    try:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0)
        for _ in range(5):
            client.chat.completions.create(
                model="sdk-model", messages=[{"role": "user", "content": "hi"}])
        trace_id = secrets.token_hex(16)
        client.chat.completions.create(
            model="sdk-model", messages=[{"role": "user", "content": "hi"}],
            extra_headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
        wait_for(lambda: collector.of_trace(bytes.fromhex(trace_id)), "the caller's sampled trace")
        # Only the caller's sampled call was recorded: its span and its one attempt's.
        with collector.lock:
            traces = {s.trace_id for s in collector.spans}
        assert traces == {bytes.fromhex(trace_id)}
    finally:
        gw.stop()
        collector.listener.stop()


@pytest.fixture
def llamacpp():
    """A real llama.cpp server (tests/llamacpp/serve.py), or a skip when none can run here."""
    python = os.environ.get("SPILLWAY_LLAMACPP_PYTHON")
    if not python:
        if os.environ.get("SPILLWAY_REQUIRE_LLAMACPP") == "1":
            pytest.fail("SPILLWAY_REQUIRE_LLAMACPP=1 but SPILLWAY_LLAMACPP_PYTHON is not set")
        pytest.skip("SPILLWAY_LLAMACPP_PYTHON is not set (see tests/llamacpp/README.md)")
    script = pathlib.Path(__file__).resolve().parents[1] / "llamacpp" / "serve.py"
    proc = subprocess.Popen(
        [python, str(script), "--port", "0", "--threads", "1", "--slots", "1", "--ctx", "2048",
         "--exit-with-parent"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ready = {}
    found = threading.Event()

    def read():
        for line in proc.stdout:
            if line.startswith("ready "):
                ready["url"] = line.split()[1]
                found.set()

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(120):
        proc.kill()
        pytest.fail("llama.cpp did not start within 120 s")
    yield ready["url"]
    proc.kill()
    proc.wait(10)


def test_a_real_llamacpp_answer_gives_the_genai_attributes_and_metrics(llamacpp, tmp_path):
    collector = Collector()
    backends = f'[[models.backends]]\nname = "llama"\nurl = "{llamacpp}/v1"\nengine = "llamacpp"\n'
    gw = gateway(backends, f'otlp_endpoint = "{collector.url}/v1/traces"\nexport_interval = "50ms"',
                 tmp_path)
    try:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0)
        ids = []
        for stream in (False, True):
            trace_id = secrets.token_hex(16)
            headers = {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
            args = dict(model="sdk-model", max_tokens=8, extra_headers=headers,
                        messages=[{"role": "user", "content": "Say hello."}])
            if stream:
                chunks = list(client.chat.completions.create(
                    stream=True, stream_options={"include_usage": True}, **args))
                assert chunks[-1].usage.completion_tokens > 0
            else:
                assert client.chat.completions.create(**args).usage.completion_tokens > 0
            ids.append(bytes.fromhex(trace_id))
        server = lambda t: [s for s in collector.of_trace(t) if s.kind == SERVER]
        wait_for(lambda: all(server(t) for t in ids), "both calls' spans", timeout=20)
        for trace_id in ids:
            [call] = server(trace_id)
            a = attrs(call)
            # What llama.cpp itself said: its model's name, its token counts, why it stopped.
            assert a["gen_ai.response.model"]
            assert a["gen_ai.usage.input_tokens"] > 0
            assert 0 < a["gen_ai.usage.output_tokens"] <= 8
            assert set(a["gen_ai.response.finish_reasons"]) <= {"stop", "length"}
        page = urllib.request.urlopen("http://" + gw.addrs[1] + "/metrics", timeout=5).read().decode()
        for series in ('gen_ai_server_request_duration_seconds_count{gen_ai_operation_name="chat",gen_ai_request_model="sdk-model"}',
                       'gen_ai_server_time_to_first_token_seconds_count{gen_ai_operation_name="chat",gen_ai_request_model="sdk-model"}',
                       'gen_ai_server_time_per_output_token_seconds_count{gen_ai_operation_name="chat",gen_ai_request_model="sdk-model"}',
                       'gen_ai_client_token_usage_count{gen_ai_operation_name="chat",gen_ai_request_model="sdk-model",gen_ai_token_type="output"}'):
            values = [float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(series)]
            assert values and values[0] >= 1, f"{series} missing from /metrics"
    finally:
        gw.stop()
        collector.listener.stop()
