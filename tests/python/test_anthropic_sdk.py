"""The official `anthropic` Python SDK, unmodified, talking to spillway's Messages API."""

import json
import urllib.request

import anthropic
import pytest

from conftest import KEY


def client(gateway, **kw):
    # The SDK sends the key as `x-api-key` and adds `/v1/messages` to the base URL itself.
    return anthropic.Anthropic(base_url=gateway.url, api_key=KEY, **kw)


def backend_stats(mock_backend):
    with urllib.request.urlopen(mock_backend.url + "/stats", timeout=10) as r:
        return json.load(r)


def test_messages_create(gateway, mock_backend):
    r = client(gateway).messages.create(
        model="sdk-model", max_tokens=5, messages=[{"role": "user", "content": "Say hi"}]
    )
    assert r.type == "message"
    assert r.role == "assistant"
    assert r.content[0].text
    assert r.usage.output_tokens == 5
    last = backend_stats(mock_backend)["last_request"]
    assert last["path"] == "/v1/messages"
    # The caller's key (x-api-key) never travels upstream.
    assert last["auth"] == "none"


def test_streamed_messages_create(gateway):
    with client(gateway).messages.stream(
        model="sdk-model", max_tokens=6, messages=[{"role": "user", "content": "Count"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert len(text.split()) == 6
    assert final.usage.output_tokens == 6
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) > 0


def test_count_tokens(gateway):
    short = client(gateway).messages.count_tokens(
        model="sdk-model", messages=[{"role": "user", "content": "Hi"}]
    )
    long = client(gateway).messages.count_tokens(
        model="sdk-model", messages=[{"role": "user", "content": "Hi " * 200}]
    )
    assert 0 < short.input_tokens < long.input_tokens


def test_errors_surface_as_typed_sdk_exceptions(gateway):
    bad_key = anthropic.Anthropic(base_url=gateway.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad_key.messages.create(model="sdk-model", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 401
    assert e.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError) as e:
        client(gateway, max_retries=0).messages.create(
            model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert e.value.body["error"]["type"] == "not_found_error"


def test_a_cut_stream_raises_instead_of_ending_cleanly(gateway):
    with pytest.raises(anthropic.APIStatusError) as e:
        with client(gateway, max_retries=0).messages.stream(
            model="broken-model", max_tokens=8, messages=[{"role": "user", "content": "Count"}]
        ) as stream:
            for _ in stream.text_stream:
                pass
    assert e.value.body["error"]["type"] == "api_error"


def test_sdk_with_default_retries_does_not_retry_a_capacity_refusal(gateway):
    sdk = client(gateway)  # the SDK's default max_retries (2)
    with pytest.raises(anthropic.InternalServerError) as e:
        sdk.messages.create(model="full-model", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 503
    assert e.value.body["error"]["type"] == "overloaded_error"
    assert e.value.response.headers["x-should-retry"] == "false"
