"""What the server needs of an engine: the in-process LLMEngine and the EngineProcess client both are one.

The engine knows token ids only: the server holds the tokenizer, and checks each request with
`limits` before it adds it (core/request_checks.py)."""

from collections.abc import Sequence
from typing import Protocol

from core.config import EngineConfig
from core.engine_metrics import EngineObservations
from core.engine_stats import EngineStats
from core.outputs import RequestOutput
from core.pooling_model import PoolingModel
from core.pooling_params import PoolingParams
from core.request_checks import EngineLimits
from core.sampling_params import SamplingParams


class ServingEngine(Protocol):
    config: EngineConfig
    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    limits: EngineLimits
    pooling: PoolingModel | None  # None: it generates

    def add_requests(self, requests: Sequence[tuple[str, list[int], SamplingParams | PoolingParams]]) -> None:
        """Checked requests (core/request_checks.py), all of one HTTP request's choices at once: for an engine
        process, one message."""
        ...

    def abort_request(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    def next_outputs(self, idle_timeout: float) -> list[RequestOutput]: ...

    def take_observations(self) -> EngineObservations | None:
        """Timings observed since the last call; from the thread that calls next_outputs."""
        ...

    def close(self) -> None: ...

    def restarted(self) -> "ServingEngine":
        """A fresh engine of the same config in place of this failed one (closed here)."""
        ...
