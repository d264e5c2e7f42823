"""The benchmark workloads: seeded lists of (prompt token ids, number of tokens to generate).

`nano_vllm_workload` is nano-vllm's offline workload, drawn in the order of its bench.py so a seed gives the same
requests. `fixed_workload` is the serving shape: distinct random prompts (no prefix cache helps) of one length and
output length, or both drawn from [x (1 - r), x (1 + r)] (range ratio r, as vLLM's random dataset: in a closed loop,
requests of one length end together and the next prompts come in bursts). `multi_turn_chats` is the prefix-heavy one.
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


def fixed_workload(num_requests: int, prompt_len: int, max_tokens: int, seed: int = 0, range_ratio: float = 0.0
                   ) -> list[Request]:
    rng = random.Random(seed)

    def length(x: int) -> int:
        return rng.randint(max(1, int(x * (1 - range_ratio))), int(x * (1 + range_ratio))) if range_ratio else x

    return [Request([rng.randrange(PROMPT_ID_LIMIT) for _ in range(length(prompt_len))], length(max_tokens))
            for _ in range(num_requests)]


def multi_turn_chats(num_chats: int, num_turns: int, system_len: int, user_len: int, reply_len: int,
                     seed: int = 0, system_seed: int = 0) -> list[list[Request]]:
    """Chats that all start with the same `system_len`-token system prompt (drawn from `system_seed` alone, so chats
    drawn with other seeds share it), `num_turns` turns each, in the order a client sends them. Turn k's prompt is
    turn k-1's, then a `reply_len`-id stand-in for the model's reply (so the generated tokens' own KV is never a hit),
    then the user's next `user_len` ids; each turn asks for `reply_len` tokens.
    """
    system_rng, rng = random.Random(f"system prompt {system_seed}"), random.Random(seed)
    system = [system_rng.randrange(PROMPT_ID_LIMIT) for _ in range(system_len)]

    def draw(n: int) -> list[int]:
        return [rng.randrange(PROMPT_ID_LIMIT) for _ in range(n)]

    chats = []
    for _ in range(num_chats):
        prompt, turns = system + draw(user_len), []
        for turn in range(num_turns):
            if turn:
                prompt = prompt + draw(reply_len) + draw(user_len)
            turns.append(Request(prompt, reply_len))
        chats.append(turns)
    return chats
