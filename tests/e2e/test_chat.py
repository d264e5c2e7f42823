"""POST /v1/chat/completions end to end, on a server started with its own --chat-template that
reads a variable (so chat_template_kwargs and the template override are both exercised)."""

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from core.tiny_model import CHATML_TEMPLATE, SPECIAL_TOKENS
from tests.e2e.serving import MODEL, RunningServer, server_config, start_server
from tests.e2e.sse_client import post_stream, texts_by_index

TEMPLATE = "{% if greeting is defined %}{{ greeting }}\n{% endif %}" + CHATML_TEMPLATE
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello! How are you?"}]
NO_EOS = {"ignore_eos": True}
SPECIAL = set(SPECIAL_TOKENS)  # in logprobs, but skipped in text (skip_special_tokens defaults to true)


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    running = start_server(model_dir, server_config(chat_template=TEMPLATE))
    yield running
    running.stop()


def tokenize_messages(server: RunningServer, messages: list[dict], **extra: object) -> dict:
    with server.http() as http:
        return http.post("/tokenize", json={"messages": messages, **extra}).json()


def test_sdk_chat_completion(server: RunningServer) -> None:
    out = server.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, extra_body=NO_EOS)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    message = out.choices[0].message
    assert message.role == "assistant" and isinstance(message.content, str)
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 6
    assert out.usage.prompt_tokens == tokenize_messages(server, MESSAGES)["count"]


def test_sdk_stream_role_first_finish_last_usage_and_equal_text(server: RunningServer) -> None:
    client = server.client()
    kwargs = {"model": MODEL, "messages": MESSAGES, "max_tokens": 12, "seed": 42, "temperature": 0.9}
    full = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert all(c.choices[0].delta.role is None for c in chunks[1:-1])
    reasons = [c.choices[0].finish_reason for c in chunks[:-1]]
    assert reasons[-1] == full.choices[0].finish_reason and all(r is None for r in reasons[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == full.usage
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == full.choices[0].message.content
    assert len({c.id for c in chunks}) == 1


def test_raw_stream_with_n_indexes_every_chunk(server: RunningServer) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 5, "n": 3, "seed": 1, "stream": True, **NO_EOS}
    with server.http() as http:
        stream = post_stream(http, "/v1/chat/completions", body)
        full = http.post("/v1/chat/completions", json=body | {"stream": False}).json()
    assert stream.content_type.startswith("text/event-stream")
    chunks = stream.chunks
    assert all("usage" not in c for c in chunks)  # without include_usage there is no usage key at all
    for index in range(3):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert mine[-1]["delta"] == {} and mine[-1]["finish_reason"] == "length"
        assert all(m["finish_reason"] is None for m in mine[:-1])
    assert texts_by_index(chunks, "content") == {c["index"]: c["message"]["content"] for c in full["choices"]}
    assert full["usage"]["completion_tokens"] == 15


def test_logprobs_chat_shape_and_bytes_rebuild_the_text(server: RunningServer) -> None:
    out = server.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, logprobs=True,
                                                  top_logprobs=3, temperature=0, extra_body=NO_EOS)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 10
    for item in content:
        assert len(item.top_logprobs) == 3
        assert item.logprob == pytest.approx(item.top_logprobs[0].logprob)  # greedy picks the top token
    rebuilt = b"".join(bytes(i.bytes) for i in content if i.token not in SPECIAL).decode("utf-8", errors="replace")
    assert rebuilt == out.choices[0].message.content


def test_emoji_and_cjk_stream_whole_characters(server: RunningServer) -> None:
    """Over a few sampled runs, find characters whose bytes span tokens; the stream never splits them."""
    client = server.client()
    spanning = 0
    for seed in range(6):
        kwargs = {"model": MODEL, "messages": [{"role": "user", "content": "你好，世界 🚀🎉 日本語"}],
                  "max_tokens": 40, "seed": seed, "logprobs": True, "extra_body": NO_EOS}
        full = client.chat.completions.create(**kwargs)
        token_bytes = [bytes(item.bytes) for item in full.choices[0].logprobs.content if item.token not in SPECIAL]
        spanning += sum(_splits_a_character(b) for b in token_bytes)
        pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs)
                  if c.choices]
        assert "".join(pieces) == full.choices[0].message.content
        assert "".join(pieces) == b"".join(token_bytes).decode("utf-8", errors="replace")
    assert spanning > 0, "premise: some generated token ended inside a multi-byte character"


def _splits_a_character(token: bytes) -> bool:
    try:
        token.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_chat_template_kwargs_are_template_variables(server: RunningServer) -> None:
    plain = tokenize_messages(server, MESSAGES)["count"]
    greeted = tokenize_messages(server, MESSAGES, chat_template_kwargs={"greeting": "Hello there"})["count"]
    assert greeted > plain
    out = server.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2,
                                                  extra_body={"chat_template_kwargs": {"greeting": "Hello there"}})
    assert out.usage.prompt_tokens == greeted


@pytest.mark.parametrize("key", ["tokenize", "chat_template", "messages", "add_generation_prompt"])
def test_template_arguments_cannot_come_from_kwargs(server: RunningServer, key: str) -> None:
    with server.http() as http:
        r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES,
                                                    "chat_template_kwargs": {key: "x"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == f"chat_template_kwargs.{key}"


def test_message_forms_render(server: RunningServer) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello!"}, {"type": "text", "text": "How?"}]}]
    joined = [{"role": "user", "content": "Hello!\nHow?"}]
    assert tokenize_messages(server, parts) == tokenize_messages(server, joined)
    developer = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert tokenize_messages(server, developer) == tokenize_messages(server, system)
    history = MESSAGES + [{"role": "assistant", "content": None}, {"role": "tool", "content": "42",
                                                                   "tool_call_id": "call_1"}]
    out = server.client().chat.completions.create(model=MODEL, messages=history, max_tokens=2)
    assert out.usage.prompt_tokens == tokenize_messages(server, history)["count"]


def test_continue_final_message(server: RunningServer) -> None:
    messages = MESSAGES + [{"role": "assistant", "content": "Fine, thank"}]
    extra = {"add_generation_prompt": False, "continue_final_message": True}
    rendered = tokenize_messages(server, messages, **extra)
    with server.http() as http:
        text = http.post("/detokenize", json={"tokens": rendered["tokens"]}).json()["prompt"]
    assert text.endswith("Fine, thank")  # no end-of-turn: the model continues the assistant's message
    out = server.client().chat.completions.create(model=MODEL, messages=messages, max_tokens=2, extra_body=extra)
    assert out.usage.prompt_tokens == rendered["count"]


def test_stop_string_in_chat_stream(server: RunningServer) -> None:
    client = server.client()
    kwargs = {"model": MODEL, "messages": MESSAGES, "max_tokens": 20, "temperature": 0, "extra_body": NO_EOS}
    text = client.chat.completions.create(**kwargs).choices[0].message.content
    stop = text[4:6]
    chunks = [c for c in client.chat.completions.create(stream=True, stop=[stop], **kwargs) if c.choices]
    pieces = [c.choices[0].delta.content or "" for c in chunks]
    assert "".join(pieces) == text[: text.index(stop)] and all(stop not in p for p in pieces)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert server.wait_idle(timeout=2.0)["num_kv_blocks_used"] == 0


def test_max_completion_tokens_and_async_client(server: RunningServer) -> None:
    async def main() -> list[int]:
        async with server.async_client() as client:
            outs = await asyncio.gather(*(
                client.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=k,
                                               extra_body=NO_EOS) for k in (1, 3, 5)))
            return [o.usage.completion_tokens for o in outs]

    assert asyncio.run(main()) == [1, 3, 5]
    with pytest.raises(openai.BadRequestError) as err:
        server.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, max_completion_tokens=3)
    assert err.value.body["param"] == "max_tokens"


def test_default_max_tokens_is_the_rest_of_the_context(server: RunningServer) -> None:
    def messages(n: int) -> list[dict]:
        return [{"role": "user", "content": "hello " * n}]

    base, step = (tokenize_messages(server, messages(n))["count"] for n in (0, 1))
    per_word = step - base
    n = (500 - base) // per_word
    prompt = tokenize_messages(server, messages(n))["count"]
    assert 480 <= prompt < 512
    out = server.client().chat.completions.create(model=MODEL, messages=messages(n), extra_body=NO_EOS)
    assert out.usage.prompt_tokens == prompt
    assert out.usage.completion_tokens == 512 - prompt and out.choices[0].finish_reason == "length"


def test_multi_turn_with_the_sdk_message_object(server: RunningServer) -> None:
    client = server.client()
    messages: list = [{"role": "user", "content": "hi"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    messages += [first.choices[0].message, {"role": "user", "content": "and then?"}]
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    as_dicts = [m if isinstance(m, dict) else {"role": m.role, "content": m.content} for m in messages]
    assert second.usage.prompt_tokens == tokenize_messages(server, as_dicts)["count"]


def test_models_and_health(server: RunningServer) -> None:
    client = server.client()
    assert [m.id for m in client.models.list()] == [MODEL, "tiny-alias"]
    card = client.models.retrieve("tiny-alias")
    assert card.id == "tiny-alias" and card.owned_by == "openai-serve"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    with server.http() as http:
        assert http.get("/health").json() == {"status": "ok", "engine_restarts": 0}
        assert http.get("/v1/models").json()["data"][0]["max_model_len"] == 512
