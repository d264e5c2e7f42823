"""Whether a request can ever be served: the checks `add_request` makes, shared by the engine and
by its client in another process (core/engine_process.py), which must refuse exactly what the
engine would, before the request leaves the server's process."""

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from core.outputs import RequestRejected
from core.sampling_params import SamplingParams


@dataclass(frozen=True)
class EngineLimits:
    vocab_size: int
    max_model_len: int
    block_size: int
    num_blocks: int  # KV-cache blocks that exist


def check_request(prompt_token_ids: list[int], params: SamplingParams, limits: EngineLimits) -> int:
    """Returns the request's max_tokens; raises RequestRejected for a request that can never be served."""
    num_prompt = len(prompt_token_ids)
    if num_prompt == 0:
        raise RequestRejected("prompt", "the prompt is empty")
    if any(not 0 <= t < limits.vocab_size for t in prompt_token_ids):
        raise RequestRejected("prompt", f"prompt token ids must be in [0, {limits.vocab_size})")
    if num_prompt >= limits.max_model_len:
        raise RequestRejected("prompt", f"the prompt has {num_prompt} tokens; this model's context "
                              f"length is {limits.max_model_len}, which leaves no room to generate")
    max_tokens = params.max_tokens if params.max_tokens is not None else limits.max_model_len - num_prompt
    if num_prompt + max_tokens > limits.max_model_len:
        raise RequestRejected("max_tokens", f"prompt ({num_prompt} tokens) + max_tokens ({max_tokens}) "
                              f"exceeds the context length of {limits.max_model_len} tokens")
    num_blocks = -(-(num_prompt + max_tokens) // limits.block_size)
    if num_blocks > limits.num_blocks:
        raise RequestRejected("max_tokens", f"the request needs {num_blocks} KV-cache blocks, more than "
                              f"the {limits.num_blocks} that exist")
    return max_tokens


class RequestIds:
    """The request ids in use, so a second request cannot take a live one's id. Thread-safe."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._lock = threading.Lock()

    def reserve(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._ids:
                raise RequestRejected("request_id", f"request id {request_id!r} is already in use")
            self._ids.add(request_id)

    def release(self, request_ids: Iterable[str]) -> None:
        with self._lock:
            self._ids.difference_update(request_ids)
