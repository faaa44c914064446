"""The OpenAI-compatible API, driven by the real ``openai`` package, over a real tritonserver."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

PROMPT = "Write a Python function that returns the square of a number."
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def api(server):
    from banditspec_server.openai_api.server import OpenAIServer
    from banditspec_server.serve import free_port

    with OpenAIServer(server.grpc_url, port=free_port(), model="smollm2") as frontend:
        yield frontend


@pytest.fixture(scope="module")
def client(api):
    import openai

    return openai.OpenAI(base_url=api.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat(client, **kw):
    args = dict(model="banditspec", messages=[{"role": "user", "content": PROMPT}], max_tokens=MAX_TOKENS, temperature=0)
    return client.chat.completions.create(**{**args, **kw})


def test_models_lists_the_controller(client):
    assert [m.id for m in client.models.list().data] == ["banditspec"]


def test_chat_equals_plain_decoding_with_usage_and_stats(client, local_vanilla):
    default = chat(client)
    vanilla = chat(client, extra_body={"policy": "vanilla"})
    expected = local_vanilla(PROMPT, MAX_TOKENS)
    assert default.choices[0].message.content == vanilla.choices[0].message.content == expected
    assert default.choices[0].message.role == "assistant"
    assert default.choices[0].finish_reason == "length"
    usage = default.usage
    assert usage.completion_tokens == MAX_TOKENS and usage.prompt_tokens > 10
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    stats = default.model_extra["speculation_stats"]
    assert stats["generated_tokens"] == MAX_TOKENS and stats["steps"] <= MAX_TOKENS
    assert set(vanilla.model_extra["speculation_stats"]["arms"]) == {"vanilla"}


def test_chat_stream_chunks_concatenate_to_the_text(client, local_vanilla):
    chunks = list(chat(client, stream=True, stream_options={"include_usage": True}))
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) > 1
    assert "".join(content) == local_vanilla(PROMPT, MAX_TOKENS)
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert finals[0].model_extra["speculation_stats"]["generated_tokens"] == MAX_TOKENS
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_completions_stream_and_not_equal_plain_decoding(client):
    prompt = "def fibonacci(n):\n    "
    plain = client.completions.create(model="banditspec", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                      extra_body={"policy": "vanilla"})
    default = client.completions.create(model="banditspec", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="banditspec", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True) if c.choices)
    assert plain.object == "text_completion" and plain.choices[0].text
    assert default.choices[0].text == plain.choices[0].text == streamed
    echoed = client.completions.create(model="banditspec", prompt=prompt, max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text.startswith(prompt)


def test_stop_and_seeded_sampling(client):
    full = chat(client).choices[0].message.content
    stop = " " + full[len(full) // 2:].split()[1]  # a whole word: a token boundary in the output
    cut = chat(client, stop=[stop])
    assert cut.choices[0].message.content == full[: full.index(stop)] and cut.choices[0].finish_reason == "stop"
    a = chat(client, temperature=0.9, seed=1234).choices[0].message.content
    b = chat(client, temperature=0.9, seed=1234).choices[0].message.content
    assert a == b


@pytest.mark.parametrize(
    "kw, param",
    [
        (dict(n=2), "n"),
        (dict(top_p=0.5), "top_p"),
        (dict(logprobs=True), "logprobs"),
        (dict(presence_penalty=0.5), "presence_penalty"),
        (dict(max_tokens=10**6), "max_tokens"),
        (dict(extra_body={"policy": "nope"}), "policy"),
        (dict(extra_body={"frobnicate": 1}), "frobnicate"),
    ],
)
def test_bad_requests_are_400_in_openai_shape_naming_the_field(client, kw, param):
    import openai

    args = dict(model="banditspec", messages=[{"role": "user", "content": PROMPT}], max_tokens=MAX_TOKENS)
    args.update(kw)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**args)
    body = err.value.body
    assert err.value.status_code == 400 and body["type"] == "invalid_request_error"
    assert body["param"] == param and param in body["message"]


def test_unknown_model_is_404_and_server_stays_healthy(client, api):
    import json
    import urllib.request

    import openai

    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert err.value.body["code"] == "model_not_found"
    with urllib.request.urlopen(api.url + "/health", timeout=30) as health:
        assert json.loads(health.read()) == {"status": "ok"}
    assert chat(client, max_tokens=2).usage.completion_tokens == 2
