"""The request bodies chat UIs send, answered with 200: Open WebUI with its advanced settings on,
SillyTavern, LibreChat and LobeChat with presets that set penalties. Each body is rebuilt from the
UI's own source (cited above it: repository, commit, file) with the values its controls take when
switched on; only `model` is ours. Fields a UI sends that this server does not know (Ollama's
options that Open WebUI copies into the body, OpenRouter's extras) are ignored and named in the
X-Ignored-Fields header: each is listed here, so a new one shows up as a test failure.
"""

import pytest

from openai_serve.ignored_fields import HEADER
from tests.e2e.serving import MODEL, RunningServer
from tests.e2e.sse_client import post_stream

CHAT = "/v1/chat/completions"

# Open WebUI (open-webui/open-webui): src/lib/components/chat/Settings/Advanced/AdvancedParams.svelte
# (commit 02530d501461ce58ab06231d7c2ef2024a141ddf): every control's value when switched from Default
# to Custom; backend/open_webui/utils/middleware.py apply_params_to_form_data copies every non-null
# param into the top level of the body for a non-Ollama model, after dropping stream_response,
# stream_delta_chunk_size, function_calling, reasoning_tags and system; logit_bias goes through
# convert_logit_bias_input_to_json ("token:bias" pairs; the ids here are in the tiny vocabulary).
# The chat request itself streams with include_usage (routers/openai.py).
OPEN_WEBUI = {
    "model": MODEL, "stream": True, "stream_options": {"include_usage": True},
    "messages": [{"role": "system", "content": "You are a helpful assistant."},
                 {"role": "user", "content": "Hello!"}],
    "seed": 0, "stop": ["</s>"], "temperature": 0.8, "reasoning_effort": "medium",
    "logit_bias": {"100": 5, "101": -100},
    "max_tokens": 128, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "frequency_penalty": 1.1, "presence_penalty": 0.0,
    "mirostat": 0, "mirostat_eta": 0.1, "mirostat_tau": 5.0, "repeat_last_n": 64, "tfs_z": 1, "repeat_penalty": 1.1,
    "use_mmap": True, "use_mlock": True, "think": True, "format": "json", "keep_alive": "5m", "num_keep": 24,
    "num_ctx": 2048, "num_batch": 512, "num_thread": 2, "num_gpu": 0,
}
# vLLM ignores these too (no field of its request has their names). repeat_penalty is Ollama's name
# for a repetition penalty; clients of this server send repetition_penalty (vLLM's), which works.
OPEN_WEBUI_IGNORED = ["mirostat", "mirostat_eta", "mirostat_tau", "repeat_last_n", "tfs_z", "repeat_penalty",
                      "use_mmap", "use_mlock", "think", "format", "keep_alive", "num_keep", "num_ctx", "num_batch",
                      "num_thread", "num_gpu"]

# SillyTavern (SillyTavern/SillyTavern, commit ba6f7b7a98cf7a5eaf4f0e81da9779a9a668ced4), Chat
# Completion source "Custom (OpenAI-compatible)": the server builds requestBody in
# src/endpoints/backends/chat-completions.js from generate_data (public/scripts/openai.js
# sendOpenAIRequest): messages, model, temperature, max_tokens, stream, presence_penalty,
# frequency_penalty, top_p, logit_bias, seed (when >= 0), n (multi-swipe), logprobs as top_logprobs;
# Default.json's openai_max_tokens 300, here with a preset's penalties of 0.7. Example dialogue
# goes as system messages named example_user / example_assistant.
SILLYTAVERN = {
    "messages": [
        {"role": "system", "content": "Write Seraphina's next reply in a fictional chat between Seraphina and User."},
        {"role": "system", "content": "[Seraphina's personality: kind, guardian of the forest]"},
        {"role": "system", "name": "example_user", "content": "Who are you?"},
        {"role": "system", "name": "example_assistant", "content": "*smiles* I am Seraphina."},
        {"role": "system", "content": "[Start a new Chat]"},
        {"role": "assistant", "content": "*You wake with a start, the forest quiet around you.*"},
        {"role": "user", "content": "Where am I?"},
    ],
    "model": MODEL, "temperature": 1, "max_tokens": 300, "stream": True, "presence_penalty": 0.7,
    "frequency_penalty": 0.7, "top_p": 1, "logit_bias": {}, "seed": 42, "n": 2, "logprobs": True, "top_logprobs": 5,
}

# LibreChat (danny-avila/LibreChat): a custom endpoint goes through LangChain JS's ChatOpenAI, whose
# options packages/api/src/endpoints/openai/llm.ts getOpenAILLMConfig builds (commit
# 00b3bc32f0f5dd65befa49a0773dae7d26d8e587): temperature, top_p, frequency/presence penalties, max
# tokens, stop, user, streaming with usage, reasoning_effort for non-OpenAI endpoints; promptCache.ts
# marks the last messages' text parts with cache_control for Claude-style endpoints; OpenRouter gets
# include_reasoning (an extra this server ignores).
LIBRECHAT = {
    "model": MODEL, "temperature": 0.7, "top_p": 0.9, "frequency_penalty": 0.5, "presence_penalty": 0.3,
    "max_tokens": 256, "stop": ["<|im_end|>"], "user": "6650b9f2c1d4a8e3f0a1b2c3", "stream": True,
    "stream_options": {"include_usage": True}, "reasoning_effort": "low", "include_reasoning": True,
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [{"type": "text", "text": "Summarize paged attention.",
                                      "cache_control": {"type": "ephemeral"}}]},
    ],
}

# LobeChat (lobehub/lobe-chat): src/libs/model-runtime/utils/openaiCompatibleFactory/index.ts
# (commit 0b46610d1b5af61578d14d6b0602b959a0ae8440) posts {...payload, messages, user,
# stream_options: {include_usage: true}}, payload being the agent's params (ChatStreamPayload:
# temperature, top_p, frequency_penalty, presence_penalty, max_tokens) and stream true.
LOBECHAT = {
    "model": MODEL, "temperature": 0.6, "top_p": 1, "frequency_penalty": 0.2, "presence_penalty": 0.4,
    "max_tokens": 200, "stream": True, "user": "8c7e2b1a-5d4f-4e3a-9b2c-1f0e9d8c7b6a",
    "stream_options": {"include_usage": True},
    "messages": [{"role": "system", "content": "You are LobeChat, an assistant."},
                 {"role": "user", "content": "Write a haiku about GPUs."}],
}

BODIES = {"open-webui": (OPEN_WEBUI, OPEN_WEBUI_IGNORED), "sillytavern": (SILLYTAVERN, []),
          "librechat": (LIBRECHAT, ["include_reasoning"]), "lobechat": (LOBECHAT, [])}


@pytest.mark.parametrize("ui", sorted(BODIES))
def test_a_chat_ui_body_is_answered(server: RunningServer, ui: str) -> None:
    body, ignored = BODIES[ui]
    body = body | {"max_tokens": 8}  # the UIs' own values, but few tokens: the model is random
    with server.http() as http:
        with http.stream("POST", CHAT, json=body) as response:
            response.read()
            assert response.status_code == 200, response.text
            assert response.headers.get(HEADER, "") == ", ".join(ignored)
        chunks = post_stream(http, CHAT, body).chunks
        whole = http.post(CHAT, json=body | {"stream": False, "stream_options": None})
    assert {c["choices"][0]["index"] for c in chunks if c["choices"]} == set(range(body.get("n", 1)))
    assert whole.status_code == 200 and len(whole.json()["choices"]) == body.get("n", 1)
