"""The benchmark workloads: seeded lists of (prompt token ids, number of tokens to generate).

`nano_vllm_workload` is the offline workload nano-vllm publishes (256 requests, prompt ids uniform
in [0, 10000), prompt lengths and max_tokens uniform in [100, 1024] inclusive), drawn in the same
order as its bench.py (a prompt's length, then its ids; all prompts before all max_tokens) so a
given seed always gives the same requests. `fixed_workload` is the serving shape: every prompt
has the same length and asks for the same number of tokens; prompts are distinct random ids, so a
prefix cache cannot make them cheaper than they are.
"""

import random
from dataclasses import dataclass

NANO_VLLM_NUM_REQUESTS = 256
NANO_VLLM_LENGTH_RANGE = (100, 1024)  # inclusive, for prompt lengths and max_tokens alike
PROMPT_ID_LIMIT = 10_000  # prompt ids are drawn from [0, PROMPT_ID_LIMIT)


@dataclass(frozen=True)
class Request:
    prompt_token_ids: list[int]
    max_tokens: int


def nano_vllm_workload(num_requests: int = NANO_VLLM_NUM_REQUESTS, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    low, high = NANO_VLLM_LENGTH_RANGE
    prompts = [[rng.randrange(PROMPT_ID_LIMIT) for _ in range(rng.randint(low, high))] for _ in range(num_requests)]
    max_tokens = [rng.randint(low, high) for _ in range(num_requests)]
    return [Request(p, m) for p, m in zip(prompts, max_tokens, strict=True)]


def fixed_workload(num_requests: int, prompt_len: int, max_tokens: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    return [Request([rng.randrange(PROMPT_ID_LIMIT) for _ in range(prompt_len)], max_tokens)
            for _ in range(num_requests)]


def total_output_tokens(requests: list[Request]) -> int:
    return sum(r.max_tokens for r in requests)
