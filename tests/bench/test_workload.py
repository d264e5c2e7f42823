"""The benchmark workloads: nano-vllm's shape, ranges, seeding, and the serving shape."""

import random

from bench.workload import PROMPT_ID_LIMIT, fixed_workload, multi_turn_chats, nano_vllm_workload


def test_nano_vllm_workload_has_the_published_shape() -> None:
    requests = nano_vllm_workload()
    prompt_lens = [len(r.prompt_token_ids) for r in requests]
    max_tokens = [r.max_tokens for r in requests]
    assert len(requests) == 256
    assert 100 <= min(prompt_lens) and max(prompt_lens) <= 1024
    assert 100 <= min(max_tokens) and max(max_tokens) <= 1024
    assert all(0 <= t < PROMPT_ID_LIMIT for r in requests for t in r.prompt_token_ids)
    # Uniform over [100, 1024]: 256 draws reach near both ends and average near the middle (562).
    assert min(prompt_lens) < 130 and max(prompt_lens) > 990
    assert 500 < sum(prompt_lens) / 256 < 625 and 500 < sum(max_tokens) / 256 < 625


def test_nano_vllm_workload_is_seeded() -> None:
    assert nano_vllm_workload(seed=0) == nano_vllm_workload(seed=0)
    assert nano_vllm_workload(seed=0) != nano_vllm_workload(seed=1)
    # Pinned: the published figures use this exact draw; a change of draw order would move them.
    assert sum(r.max_tokens for r in nano_vllm_workload(seed=0)) == 150_245
    first = nano_vllm_workload(seed=0)[0]
    assert (len(first.prompt_token_ids), first.prompt_token_ids[:3], first.max_tokens) == (964, [6311, 6890, 663], 480)


def test_a_smaller_workload_is_the_same_draw_order() -> None:
    small = nano_vllm_workload(num_requests=4, seed=0)
    assert [len(r.prompt_token_ids) for r in small] == [len(r.prompt_token_ids) for r in nano_vllm_workload()[:4]]


def test_fixed_workload_prompts_have_the_length_and_differ() -> None:
    requests = fixed_workload(8, prompt_len=1024, max_tokens=128, seed=3)
    assert all(len(r.prompt_token_ids) == 1024 and r.max_tokens == 128 for r in requests)
    assert len({tuple(r.prompt_token_ids[:16]) for r in requests}) == 8  # no shared prefixes for a cache to reuse
    assert fixed_workload(8, 1024, 128, seed=3) == requests
    assert fixed_workload(8, 1024, 128, seed=4) != requests


def test_a_range_ratio_draws_lengths_around_the_given_ones_and_none_keeps_the_old_draw() -> None:
    varied = fixed_workload(400, prompt_len=100, max_tokens=20, seed=3, range_ratio=0.5)
    prompt_lens, output_lens = [len(r.prompt_token_ids) for r in varied], [r.max_tokens for r in varied]
    assert min(prompt_lens) >= 50 and max(prompt_lens) <= 150 and min(output_lens) >= 10 and max(output_lens) <= 30
    assert len(set(prompt_lens)) > 50 and len(set(output_lens)) > 15  # spread over the range, not one length
    assert abs(sum(output_lens) / len(output_lens) - 20) < 1.5  # centred on the given length
    rng = random.Random(3)  # ratio 0: the draw from before the option existed, every prompt token from one stream
    old_draw = [[rng.randrange(PROMPT_ID_LIMIT) for _ in range(1024)] for _ in range(8)]
    assert [r.prompt_token_ids for r in fixed_workload(8, 1024, 128, seed=3, range_ratio=0.0)] == old_draw


def test_multi_turn_chats_share_the_system_prompt_and_grow_turn_by_turn() -> None:
    chats = multi_turn_chats(num_chats=3, num_turns=4, system_len=64, user_len=8, reply_len=5, seed=1)
    system = chats[0][0].prompt_token_ids[:64]
    assert len(chats) == 3 and all(len(chat) == 4 for chat in chats)
    for chat in chats:
        assert chat[0].prompt_token_ids[:64] == system
        for turn, (request, after) in enumerate(zip(chat, chat[1:] + [None], strict=True)):
            # system + one user message, then a reply and a user message per turn before this one
            assert len(request.prompt_token_ids) == 64 + 8 + turn * (5 + 8) and request.max_tokens == 5
            assert all(0 <= t < PROMPT_ID_LIMIT for t in request.prompt_token_ids)
            if after is not None:  # the whole previous prompt is the next one's prefix, the rest is new
                assert after.prompt_token_ids[:len(request.prompt_token_ids)] == request.prompt_token_ids
    firsts = [chat[0].prompt_token_ids[64:] for chat in chats]
    assert len({tuple(f) for f in firsts}) == 3  # chats differ after the system prompt
    assert chats[0][0].prompt_token_ids[64:] != system[:8]  # the user draw is not the system draw again


def test_multi_turn_chats_are_seeded_and_keep_the_system_prompt_across_seeds() -> None:
    def chats(seed: int, system_seed: int = 0) -> list[list[list[int]]]:
        drawn = multi_turn_chats(2, 2, system_len=32, user_len=4, reply_len=3, seed=seed, system_seed=system_seed)
        return [[r.prompt_token_ids for r in chat] for chat in drawn]

    assert chats(0) == chats(0) and chats(0) != chats(1)
    assert chats(0)[0][0][:32] == chats(1)[0][0][:32]  # another level's chats: the same system prompt
    assert chats(0, system_seed=1)[0][0][:32] != chats(0)[0][0][:32]
