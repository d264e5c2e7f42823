"""What the engine publishes each step: per request, the tokens it generated in that step."""

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from gpu.batch import TokenLogprobs


class FinishReason(StrEnum):
    STOP = "stop"  # EOS, a stop token id, or (decided outside the engine) a stop string
    LENGTH = "length"  # max_tokens or the model's context length
    ABORT = "abort"  # aborted by the caller: disconnect, shutdown, stop string
    # The engine could not run it (a request its front end should have refused, or a fault that only its
    # batch rows raise): it alone ends, and the others go on. Never an OpenAI finish_reason: the server
    # turns it into an error for its client.
    ERROR = "error"


@dataclass(slots=True)
class RequestOutput:
    """The delta of one request in one engine step. Treated as immutable once published; not frozen
    because a frozen dataclass's constructor costs several times more, once per request per step."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs | None]
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int  # generated so far, including this step's
    num_cached_prompt_tokens: int = 0
    # With the request's first token when it asked for prompt_logprobs: one per prompt token, the first None.
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    # A pooling request's one output (float32, gpu/pooling.py), with its finish.
    pooled: np.ndarray | None = None

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None


class RequestRejected(ValueError):
    """A request that can never be served (too long for the context or the KV cache)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
