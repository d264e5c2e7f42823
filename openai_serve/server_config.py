"""The HTTP server's configuration (the engine's lives in core.config). Frozen; validated on creation."""

from dataclasses import dataclass

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class ServerConfig:
    served_model_names: tuple[str, ...]  # the first is the one /v1/models lists first
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    allowed_origins: tuple[str, ...] = ("*",)  # CORS; vLLM's default, so browser chat UIs work
    chat_template: str | None = None  # the template text that replaces the model's own
    max_request_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Engine requests in flight (a request with n choices counts n); past it, new requests get 503.
    max_pending_requests: int = 4096
    log_level: str = "info"
    # sys.setswitchinterval for the server process: the engine thread and the event loop share one
    # interpreter lock, and a thread that wants it waits up to this long for the holder to let go.
    gil_switch_interval_ms: float = 5.0

    def __post_init__(self) -> None:
        if not self.served_model_names or not all(self.served_model_names):
            raise ValueError("served_model_names must hold at least one non-empty name")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty (leave it unset for no authentication)")
        if self.max_request_body_bytes < 1024:
            raise ValueError(f"max_request_body_bytes must be >= 1024, got {self.max_request_body_bytes}")
        if not 0.01 <= self.gil_switch_interval_ms <= 1000:
            raise ValueError(f"gil_switch_interval_ms must be in [0.01, 1000], got {self.gil_switch_interval_ms}")
        if self.max_pending_requests < 1:
            raise ValueError(f"max_pending_requests must be >= 1, got {self.max_pending_requests}")
