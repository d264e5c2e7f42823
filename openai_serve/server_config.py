"""The HTTP server's configuration (the engine's lives in core.config). Frozen; validated on creation.

Its fields are settings as the engine's are (core.config.setting): flags, config-file keys, defaults
and help come from here.
"""

import json
from dataclasses import dataclass

from core.config import check_choices, setting
from openai_serve.parsers.reasoning import PARSER_CHOICES as REASONING_PARSERS
from openai_serve.parsers.tool_parsers import PARSER_CHOICES as TOOL_CALL_PARSERS

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
BODY_BYTES_PER_CONTEXT_TOKEN = 32
MIN_DEFAULT_BODY_BYTES = 1024 * 1024


def parse_origins(value: str) -> tuple[str, ...]:
    """A JSON list (vLLM's spelling) or a comma-separated string; empty: no CORS."""
    text = value.strip()
    if text.startswith("["):
        return tuple(str(v) for v in json.loads(text))
    return tuple(origin.strip() for origin in text.split(",") if origin.strip())


@dataclass(frozen=True)
class ServerConfig:
    # The first is the one /v1/models lists first. Required here: the CLI defaults it to the model's name.
    served_model_names: tuple[str, ...] = setting(
        help="name(s) clients use in 'model' (default: the --model argument as given)", name="served_model_name")
    host: str = setting("127.0.0.1", "address to bind")
    port: int = setting(8000, "port to bind")
    api_key: str | None = setting(None, "require 'Authorization: Bearer KEY' (default: $OPENAI_SERVE_API_KEY, "
                                  "else no key)")
    # CORS; vLLM's default, so browser chat UIs work.
    allowed_origins: tuple[str, ...] = setting(("*",), "CORS origins: a JSON list or comma-separated; '' turns "
                                               "CORS off", parse=parse_origins)
    # The template text that replaces the model's own (the CLI reads a file or takes the text).
    chat_template: str | None = setting(None, "Jinja chat template (a file, or the template text) replacing "
                                        "the model's")
    # Reading a JSON body holds the event loop (and Python's interpreter lock) for about 12 ms of CPU per MiB
    # of small objects (docs/reliability.md), so the limit bounds that stall too: by default, what the
    # largest prompt that fits the context needs (docs/reliability.md: at most ~12 bytes per token, as escaped
    # JSON text or as token ids), with room to spare.
    max_request_body_bytes: int | None = setting(None, "larger request bodies get 413 (default: 32 bytes per token "
                                                 "of the model's context, at least 1 MiB)")
    # Connections (openai_serve/http_protocol.py): past the cap a new one gets 503 and is closed, logged.
    max_connections: int = setting(2048, "open connections; more are answered 503 and closed at once (the server "
                                   "raises its open-files limit to fit them where the system allows)")
    timeout_keep_alive: float = setting(5.0, "seconds an idle keep-alive connection stays open (uvicorn's)")
    request_header_timeout: float = setting(10.0, "seconds a client has to send a request's line and headers, "
                                            "from connecting or from starting its next request (else 408)")
    request_body_timeout: float = setting(60.0, "seconds a client has to send a request's body (else 408)")
    # What one request may ask for (openai_serve/request_limits.py); more is a 400.
    max_prompts_per_request: int = setting(256, "prompts in one /v1/completions request")
    max_choices_per_request: int = setting(256, "generations one request asks for: prompts x n")
    max_stop_strings: int = setting(64, "stop strings in one request")
    max_stop_string_length: int = setting(256, "characters in one stop string")
    # Engine requests in flight (a request with n choices counts n); past it, new requests get 503.
    max_pending_requests: int = setting(4096, "engine requests in flight (n choices count n) before new "
                                        "requests get 503")
    # A failed engine (process killed, device fault) is replaced; past this many restarts within 10 minutes
    # (a crash loop) the server stays up answering 503 until it is restarted.
    max_engine_restarts: int = setting(5, "restarts of a failed engine within 10 minutes before the server gives "
                                       "up on it (then every request gets 503); 0: never restart")
    exit_on_engine_failure: bool = setting(False, "exit with status 1 when the engine fails, instead of restarting "
                                           "it (for orchestrators that restart the server)")
    # Backpressure: a response whose client stops reading must not keep its sequences generating.
    max_unread_steps: int = setting(512, "engine steps of output a response may leave unread (per choice) before "
                                    "its generation is stopped and its KV blocks freed: a client that stops "
                                    "reading a stream")
    log_level: str = setting("info", "log level: info logs one line per request and, while busy, a stats line "
                             "every --stats-log-interval-s; debug adds /health and /metrics requests",
                             choices=LOG_LEVELS)
    stats_log_interval_s: float = setting(10.0, "seconds between two stats lines (throughput, running and "
                                          "waiting requests, KV-cache usage, prefix-cache hits) while busy")
    web_ui: bool = setting(True, "the chat page at /")
    engine_process: bool = setting(True, "run the engine in its own process, off the HTTP side's interpreter "
                                   "lock (off: a thread of the server's process)")
    # sys.setswitchinterval for the server process: how long a thread that wants Python's interpreter
    # lock waits for the holder to let go. Its threads are the event loop and the bridge's output thread
    # (and the engine's, with --no-engine-process).
    gil_switch_interval_ms: float = setting(5.0, "how long a thread of the server's process waits for "
                                            "another to release Python's interpreter lock: the event loop, the "
                                            "thread reading the engine's outputs, and (with --no-engine-process) "
                                            "the engine's own thread")
    # Unknown request fields: a 400 (OpenAI's way) instead of ignored with a warning (vLLM's way).
    strict_request_fields: bool = setting(False, "answer unknown request fields with a 400 (off: ignore them, log "
                                          "each name once and name them in the X-Ignored-Fields header, as vLLM "
                                          "ignores them)")
    tool_call_parser: str = setting("auto", "how tool calls are read from answers: hermes (<tool_call> JSON: Qwen, "
                                    "Hermes), llama3_json, qwen3_coder (Qwen3-Coder, Qwen3.5), harmony (gpt-oss), "
                                    "mistral, glm45, deepseek_v3, deepseek_v31, kimi_k2, none, or auto: chosen "
                                    "from the chat template; under tool_choice auto a grammar holds each call the "
                                    "model opens to the tools' schemas", choices=TOOL_CALL_PARSERS)
    reasoning_parser: str = setting("none", "put the thinking of answers into reasoning_content: qwen3, "
                                    "deepseek_r1, deepseek_v3, glm45, kimi_k2 (<think>), mistral ([THINK]), "
                                    "harmony or openai_gptoss (gpt-oss's analysis channel), or none",
                                    choices=("none", *REASONING_PARSERS))

    # The Responses API's stored responses (store: true, OpenAI's default), in memory.
    responses_store_max_entries: int = setting(1024, "stored responses of the Responses API kept for GET "
                                               "/v1/responses/{id} and previous_response_id, oldest dropped first; "
                                               "0 stores none")
    responses_store_max_age_s: float = setting(24 * 3600.0, "how long a stored response is kept, in seconds")

    def body_limit(self, max_model_len: int) -> int:
        """--max-request-body-bytes, or its default for a model with this context."""
        if self.max_request_body_bytes is not None:
            return self.max_request_body_bytes
        return max(MIN_DEFAULT_BODY_BYTES, BODY_BYTES_PER_CONTEXT_TOKEN * max_model_len)

    def __post_init__(self) -> None:
        if not self.served_model_names or not all(self.served_model_names):
            raise ValueError("served_model_names must hold at least one non-empty name")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty (leave it unset for no authentication)")
        if self.max_request_body_bytes is not None and self.max_request_body_bytes < 1024:
            raise ValueError(f"max_request_body_bytes must be >= 1024, got {self.max_request_body_bytes}")
        if not 0.01 <= self.gil_switch_interval_ms <= 1000:
            raise ValueError(f"gil_switch_interval_ms must be in [0.01, 1000], got {self.gil_switch_interval_ms}")
        for name in ("max_prompts_per_request", "max_choices_per_request", "max_stop_strings",
                     "max_stop_string_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        for name in ("timeout_keep_alive", "request_header_timeout", "request_body_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_engine_restarts < 0:
            raise ValueError(f"max_engine_restarts must be >= 0, got {self.max_engine_restarts}")
        if self.max_unread_steps < 1:
            raise ValueError(f"max_unread_steps must be >= 1, got {self.max_unread_steps}")
        if self.stats_log_interval_s <= 0:
            raise ValueError(f"stats_log_interval_s must be > 0, got {self.stats_log_interval_s}")
        if self.max_pending_requests < 1:
            raise ValueError(f"max_pending_requests must be >= 1, got {self.max_pending_requests}")
        if self.responses_store_max_entries < 0:
            raise ValueError(f"responses_store_max_entries must be >= 0, got {self.responses_store_max_entries}")
        if self.responses_store_max_age_s <= 0:
            raise ValueError(f"responses_store_max_age_s must be > 0, got {self.responses_store_max_age_s}")
        check_choices(self)
