"""The official `openai` Python SDK, unmodified, talking to spillway."""

import json
import urllib.request

import openai

from conftest import KEY


def client(gateway, **kw):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, **kw)


def backend_stats(mock_backend):
    with urllib.request.urlopen(mock_backend.url + "/stats", timeout=10) as r:
        return json.load(r)


def test_chat_completion(gateway):
    r = client(gateway).chat.completions.create(
        model="sdk-model", messages=[{"role": "user", "content": "Say hi"}], max_tokens=5
    )
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.usage.completion_tokens == 5


def test_streamed_chat_completion(gateway):
    stream = client(gateway).chat.completions.create(
        model="sdk-model",
        messages=[{"role": "user", "content": "Count"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 6
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


def test_embeddings_with_the_sdk_default_base64_encoding(gateway, mock_backend):
    r = client(gateway).embeddings.create(model="sdk-model", input=["alpha", "beta"])
    assert len(r.data) == 2
    assert all(isinstance(x, float) for x in r.data[0].embedding)
    assert len(r.data[0].embedding) == len(r.data[1].embedding) > 0
    # The SDK asked for base64 and the field reached the backend untouched.
    assert backend_stats(mock_backend)["last_request"]["body"]["encoding_format"] == "base64"


def test_errors_surface_as_typed_sdk_exceptions(gateway):
    bad_key = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-wrong", max_retries=0)
    try:
        bad_key.chat.completions.create(model="sdk-model", messages=[{"role": "user", "content": "x"}])
        raise AssertionError("expected an authentication error")
    except openai.AuthenticationError as e:
        assert e.status_code == 401
        assert e.code == "invalid_api_key"
    try:
        client(gateway, max_retries=0).chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}]
        )
        raise AssertionError("expected a not-found error")
    except openai.NotFoundError as e:
        assert e.code == "model_not_found"


def metric(gateway, prefix):
    with urllib.request.urlopen("http://" + gateway.addrs[1] + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(prefix):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_sdk_with_default_retries_does_not_retry_when_told_not_to(gateway):
    requests = 'spillway_requests_total{tenant="sdk",model="full-model",backend="full",status="503"}'
    before = metric(gateway, requests)
    sdk = client(gateway)  # the SDK's default max_retries (2)
    assert sdk.max_retries == 2
    try:
        sdk.chat.completions.create(model="full-model", messages=[{"role": "user", "content": "x"}])
        raise AssertionError("expected a 503")
    except openai.InternalServerError as e:
        assert e.status_code == 503
        assert e.code == "capacity_exhausted"
        assert e.response.headers["x-should-retry"] == "false"
        assert "retry-after" in e.response.headers
    # One request reached spillway: the SDK did not stack its two retries on spillway's.
    assert metric(gateway, requests) - before == 1


def test_responses_create(gateway, mock_backend):
    r = client(gateway).responses.create(model="sdk-model", input="Say hi", max_output_tokens=5)
    assert r.object == "response"
    assert r.output_text
    assert r.usage.output_tokens == 5
    assert backend_stats(mock_backend)["last_request"]["path"] == "/v1/responses"


def test_a_responses_create_without_a_model_goes_to_the_tenants_default(gateway, mock_backend):
    raw = client(gateway).responses.with_raw_response.create(input="Say hi", max_output_tokens=3)
    assert raw.headers["x-spillway-model"] == "sdk-model"
    r = raw.parse()
    assert r.model == "sdk-model"
    assert r.usage.output_tokens == 3
    assert backend_stats(mock_backend)["last_request"]["model"] == "sdk-model"


def test_streamed_responses_create(gateway):
    events = list(
        client(gateway).responses.create(model="sdk-model", input="Count", max_output_tokens=6, stream=True)
    )
    types = [e.type for e in events]
    assert types[0] == "response.created"
    assert types[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert len(text.split()) == 6
    assert events[-1].response.usage.output_tokens == 6


def test_a_cut_responses_stream_ends_with_an_error_event_not_completed(gateway):
    events = list(
        client(gateway, max_retries=0).responses.create(
            model="broken-model", input="Count", max_output_tokens=8, stream=True
        )
    )
    types = [e.type for e in events]
    assert types[-1] == "error", types
    assert "response.completed" not in types
    assert events[-1].code == "upstream_unavailable"


def test_a_stored_response_is_retrieved_continued_and_deleted(gateway):
    sdk = client(gateway)
    first = sdk.responses.create(model="sdk-model", input="Say hi", max_output_tokens=3)
    assert sdk.responses.retrieve(first.id).id == first.id
    items = sdk.responses.input_items.list(first.id)
    assert len(items.data) >= 1
    # A continuation names no model: spillway routes it to the backend that has the response.
    second = sdk.responses.create(previous_response_id=first.id, input="And then?", max_output_tokens=3)
    assert second.previous_response_id == first.id
    sdk.responses.delete(first.id)
    try:
        client(gateway, max_retries=0).responses.retrieve(first.id)
        raise AssertionError("expected a not-found error")
    except openai.NotFoundError as e:
        assert e.code == "response_not_found"


def test_stored_chat_completions(gateway):
    sdk = client(gateway)
    made = sdk.chat.completions.create(
        model="sdk-model", messages=[{"role": "user", "content": "Remember me"}], max_tokens=3,
        store=True, metadata={"topic": "sdk"},
    )
    listed = [c.id for c in sdk.chat.completions.list()]
    assert made.id in listed
    got = sdk.chat.completions.retrieve(made.id)
    # spillway tags its tenant on what the backend keeps.
    assert got.metadata == {"topic": "sdk", "spillway_tenant": "sdk"}
    messages = sdk.chat.completions.messages.list(made.id)
    assert messages.data[0].content == "Remember me"
    updated = sdk.chat.completions.update(made.id, metadata={"topic": "changed"})
    assert updated.metadata["topic"] == "changed"
    assert sdk.chat.completions.delete(made.id).deleted
    try:
        client(gateway, max_retries=0).chat.completions.retrieve(made.id)
        raise AssertionError("expected a not-found error")
    except openai.NotFoundError:
        pass
