"""BlockManager: exact block ids, ref counts, prefix hits, eviction order, collision checks."""

from core.block_manager import BlockManager, block_key
from core.sampling_params import SamplingParams
from core.sequence import Sequence

BLOCK = 4


def make_seq(token_ids: list[int], request_id: str = "r") -> Sequence:
    return Sequence(request_id, token_ids, SamplingParams(max_tokens=4), max_tokens=4)


def admit(bm: BlockManager, seq: Sequence) -> None:
    """What the scheduler does: take prefix hits, then allocate the rest of the known tokens."""
    hit_ids, hit_keys = bm.match_prefix(seq)
    bm.admit(seq, hit_ids, hit_keys)
    bm.allocate(seq, seq.num_tokens - seq.num_computed_tokens)
    seq.num_computed_tokens = seq.num_tokens


def assert_idle(bm: BlockManager) -> None:
    assert all(count == 0 for count in bm.ref_counts)
    assert len(bm.free_ids) + len(bm.evictable_ids) == bm.num_blocks
    assert set(bm.free_ids).isdisjoint(bm.evictable_ids)


def test_allocation_takes_lowest_free_blocks_in_order() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK)
    seq = make_seq(list(range(10)))
    admit(bm, seq)
    assert seq.block_ids == [0, 1, 2]
    assert bm.ref_counts[:4] == [1, 1, 1, 0]
    assert bm.num_available_blocks == 5


def test_only_full_blocks_get_keys() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK)
    seq = make_seq(list(range(10)))
    admit(bm, seq)
    assert len(seq.block_keys) == 2
    assert bm.block_keys[0] == block_key(None, [0, 1, 2, 3])
    assert bm.block_keys[1] == block_key(bm.block_keys[0], [4, 5, 6, 7])
    assert bm.block_keys[2] is None


def test_free_returns_keyed_blocks_to_evictable_and_others_to_free() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK)
    seq = make_seq(list(range(10)))
    admit(bm, seq)
    bm.free(seq)
    assert list(bm.evictable_ids) == [1, 0]  # tail first: evicted before the shared prefix
    assert list(bm.free_ids) == [3, 4, 5, 6, 7, 2]
    assert seq.block_ids == [] and seq.block_keys == []
    assert_idle(bm)


def test_prefix_hit_reuses_blocks_and_shares_ref_counts() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK)
    first = make_seq(list(range(10)), "a")
    admit(bm, first)
    second = make_seq(list(range(8)) + [99, 98, 97], "b")
    hit_ids, _ = bm.match_prefix(second)
    assert hit_ids == [0, 1]
    admit(bm, second)
    assert second.block_ids == [0, 1, 3]
    assert bm.ref_counts[:4] == [2, 2, 1, 1]
    bm.free(first)
    bm.free(second)
    assert_idle(bm)


def test_last_prompt_token_is_never_served_from_cache() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK)
    admit(bm, make_seq(list(range(8)), "a"))
    again = make_seq(list(range(8)), "b")
    hit_ids, _ = bm.match_prefix(again)
    assert hit_ids == [0]  # block 1 holds the last token, which must be computed to sample


def test_hit_on_evictable_block_takes_it_back() -> None:
    bm = BlockManager(num_blocks=4, block_size=BLOCK)
    first = make_seq(list(range(9)), "a")
    admit(bm, first)
    bm.free(first)
    second = make_seq(list(range(9)), "b")
    admit(bm, second)
    assert second.block_ids[:2] == [0, 1]
    assert second.num_computed_tokens == 9
    assert 0 not in bm.evictable_ids and 1 not in bm.evictable_ids
    assert bm.ref_counts[0] == 1


def test_eviction_is_least_recently_freed_first_and_clears_keys() -> None:
    bm = BlockManager(num_blocks=4, block_size=BLOCK)
    a = make_seq([1] * 4 + [2] * 4, "a")  # blocks 0, 1 keyed
    admit(bm, a)
    bm.free(a)  # evictable order: 1, 0
    b = make_seq([7] * 12, "b")
    admit(bm, b)  # needs 3: free 2, 3, then evicts 1
    assert b.block_ids == [2, 3, 1]
    assert list(bm.evictable_ids) == [0]
    assert block_key(block_key(None, [1] * 4), [2] * 4) not in bm.key_to_block
    sevens = block_key(block_key(None, [7] * 4), [7] * 4)
    assert bm.block_keys[1] == block_key(sevens, [7] * 4)  # the third block of b


def test_hash_collision_is_caught_by_stored_tokens() -> None:
    bm = BlockManager(num_blocks=4, block_size=BLOCK)
    a = make_seq([1, 2, 3, 4, 5], "a")
    admit(bm, a)
    bm.block_token_ids[0] = (9, 9, 9, 9)  # as if another prefix had the same key
    hit_ids, _ = bm.match_prefix(make_seq([1, 2, 3, 4, 5], "b"))
    assert hit_ids == []


def test_equal_blocks_computed_twice_keep_one_key() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK)
    a, b = make_seq([5] * 5, "a"), make_seq([5] * 5, "b")
    bm.admit(a, [], [])
    bm.allocate(a, 5)
    bm.admit(b, [], [])  # in the same step, before a's blocks could be hit
    bm.allocate(b, 5)
    assert bm.key_to_block[block_key(None, [5] * 4)] == 0
    assert bm.block_keys[2] is None
    bm.free(a)
    bm.free(b)
    assert 2 in bm.free_ids and 0 in bm.evictable_ids
    assert_idle(bm)


def test_decode_growth_keys_block_when_it_fills() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK)
    seq = make_seq([1, 2, 3], "a")
    admit(bm, seq)
    assert seq.block_keys == []
    seq.add_pending_token(0, is_last=False)  # sampled on the device: its block cannot be keyed yet
    bm.allocate(seq, 1)
    assert seq.block_ids == [0] and seq.block_keys == []
    seq.num_computed_tokens = 4
    seq.resolve_pending_token(4)  # reaches the host
    seq.add_pending_token(0, is_last=False)
    assert bm.num_blocks_to_append(seq, 1) == 1
    bm.allocate(seq, 1)  # the next allocation keys the block the known token filled
    assert seq.block_ids == [0, 1] and len(seq.block_keys) == 1


def test_prefix_caching_disabled_keys_nothing() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK, enable_prefix_caching=False)
    a = make_seq(list(range(9)), "a")
    admit(bm, a)
    bm.free(a)
    assert not bm.key_to_block and not bm.evictable_ids
    assert bm.match_prefix(make_seq(list(range(9)), "b")) == ([], [])
    assert_idle(bm)


def test_num_blocks_to_admit_counts_evictable_hits() -> None:
    bm = BlockManager(num_blocks=4, block_size=BLOCK)
    a = make_seq(list(range(9)), "a")
    admit(bm, a)
    bm.free(a)
    b = make_seq(list(range(9)), "b")
    hit_ids, _ = bm.match_prefix(b)
    # 2 evictable hits leave the pool, plus 1 new block for token 8.
    assert bm.num_blocks_to_admit(b, hit_ids, 1) == 3
