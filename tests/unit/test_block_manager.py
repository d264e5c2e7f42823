"""BlockManager: exact block ids, ref counts, prefix hits, eviction order, collision checks; for a model with one
full-attention group, and with sliding-window groups beside it (blocks released before the window, hits that need
the window's blocks)."""

from core.block_manager import BlockManager, block_key
from core.sampling_params import SamplingParams
from core.sequence import Sequence
from gpu.kv_cache_groups import KVCacheGroup

BLOCK = 4
WINDOW = 6  # a query at p sees p - 5 .. p: block i is released once p - 5 > 4 * i + 3


def full_attention(num_blocks: int) -> BlockManager:
    return BlockManager([KVCacheGroup(None, num_blocks)], BLOCK)


def full_and_windowed(num_full: int, num_windowed: int) -> BlockManager:
    return BlockManager([KVCacheGroup(None, num_full), KVCacheGroup(WINDOW, num_windowed)], BLOCK)


def make_seq(token_ids: list[int], request_id: str = "r") -> Sequence:
    return Sequence(request_id, token_ids, SamplingParams(max_tokens=4), max_tokens=4)


def admit(bm: BlockManager, seq: Sequence) -> None:
    """What the scheduler does: take prefix hits, then allocate the rest of the known tokens."""
    bm.admit(seq, bm.match_prefix(seq))
    bm.allocate(seq, seq.num_tokens - seq.num_computed_tokens)
    seq.num_computed_tokens = seq.num_tokens


def assert_idle(bm: BlockManager) -> None:
    for pool in bm.pools:
        assert all(count == 0 for count in pool.ref_counts)
        assert len(pool.free_ids) + len(pool.evictable_ids) == pool.num_blocks
        assert set(pool.free_ids).isdisjoint(pool.evictable_ids)


def decode(bm: BlockManager, seq: Sequence, token_id: int) -> None:
    """One decode step of a caught-up sequence: its sampled token computed, known at once."""
    seq.add_pending_token(0, is_last=False)
    assert bm.can_append(seq, 1)
    bm.allocate(seq, 1)
    seq.num_computed_tokens += 1
    seq.resolve_pending_token(token_id)


def test_allocation_takes_lowest_free_blocks_in_order() -> None:
    bm = full_attention(8)
    seq = make_seq(list(range(10)))
    admit(bm, seq)
    assert seq.block_tables[0] == [0, 1, 2]
    assert bm.pools[0].ref_counts[:4] == [1, 1, 1, 0]
    assert bm.pools[0].num_available_blocks == 5


def test_only_full_blocks_get_keys() -> None:
    bm = full_attention(8)
    seq = make_seq(list(range(10)))
    admit(bm, seq)
    assert len(seq.block_keys) == 2
    assert bm.pools[0].block_keys[0] == block_key(None, [0, 1, 2, 3])
    assert bm.pools[0].block_keys[1] == block_key(bm.pools[0].block_keys[0], [4, 5, 6, 7])
    assert bm.pools[0].block_keys[2] is None


def test_free_returns_keyed_blocks_to_evictable_and_others_to_free() -> None:
    bm = full_attention(8)
    seq = make_seq(list(range(10)))
    admit(bm, seq)
    bm.free(seq)
    assert list(bm.pools[0].evictable_ids) == [1, 0]  # tail first: evicted before the shared prefix
    assert list(bm.pools[0].free_ids) == [3, 4, 5, 6, 7, 2]
    assert seq.block_tables == [] and seq.block_keys == []
    assert_idle(bm)


def test_prefix_hit_reuses_blocks_and_shares_ref_counts() -> None:
    bm = full_attention(8)
    first = make_seq(list(range(10)), "a")
    admit(bm, first)
    second = make_seq(list(range(8)) + [99, 98, 97], "b")
    hit_ids = bm.match_prefix(second).block_tables[0]
    assert hit_ids == [0, 1]
    admit(bm, second)
    assert second.block_tables[0] == [0, 1, 3]
    assert bm.pools[0].ref_counts[:4] == [2, 2, 1, 1]
    bm.free(first)
    bm.free(second)
    assert_idle(bm)


def test_last_prompt_token_is_never_served_from_cache() -> None:
    bm = full_attention(8)
    admit(bm, make_seq(list(range(8)), "a"))
    again = make_seq(list(range(8)), "b")
    hit_ids = bm.match_prefix(again).block_tables[0]
    assert hit_ids == [0]  # block 1 holds the last token, which must be computed to sample


def test_hit_on_evictable_block_takes_it_back() -> None:
    bm = full_attention(4)
    first = make_seq(list(range(9)), "a")
    admit(bm, first)
    bm.free(first)
    second = make_seq(list(range(9)), "b")
    admit(bm, second)
    assert second.block_tables[0][:2] == [0, 1]
    assert second.num_computed_tokens == 9
    assert 0 not in bm.pools[0].evictable_ids and 1 not in bm.pools[0].evictable_ids
    assert bm.pools[0].ref_counts[0] == 1


def test_eviction_is_least_recently_freed_first_and_clears_keys() -> None:
    bm = full_attention(4)
    a = make_seq([1] * 4 + [2] * 4, "a")  # blocks 0, 1 keyed
    admit(bm, a)
    bm.free(a)  # evictable order: 1, 0
    b = make_seq([7] * 12, "b")
    admit(bm, b)  # needs 3: free 2, 3, then evicts 1
    assert b.block_tables[0] == [2, 3, 1]
    assert list(bm.pools[0].evictable_ids) == [0]
    assert block_key(block_key(None, [1] * 4), [2] * 4) not in bm.pools[0].key_to_block
    sevens = block_key(block_key(None, [7] * 4), [7] * 4)
    assert bm.pools[0].block_keys[1] == block_key(sevens, [7] * 4)  # the third block of b


def test_hash_collision_is_caught_by_stored_tokens() -> None:
    bm = full_attention(4)
    a = make_seq([1, 2, 3, 4, 5], "a")
    admit(bm, a)
    bm.pools[0].block_token_ids[0] = (9, 9, 9, 9)  # as if another prefix had the same key
    hit_ids = bm.match_prefix(make_seq([1, 2, 3, 4, 5], "b")).block_tables[0]
    assert hit_ids == []


def test_equal_blocks_computed_twice_keep_one_key() -> None:
    bm = full_attention(8)
    a, b = make_seq([5] * 5, "a"), make_seq([5] * 5, "b")
    bm.admit(a, bm.no_hit())
    bm.allocate(a, 5)
    bm.admit(b, bm.no_hit())  # in the same step, before a's blocks could be hit
    bm.allocate(b, 5)
    assert bm.pools[0].key_to_block[block_key(None, [5] * 4)] == 0
    assert bm.pools[0].block_keys[2] is None
    bm.free(a)
    bm.free(b)
    assert 2 in bm.pools[0].free_ids and 0 in bm.pools[0].evictable_ids
    assert_idle(bm)


def test_decode_growth_keys_block_when_it_fills() -> None:
    bm = full_attention(8)
    seq = make_seq([1, 2, 3], "a")
    admit(bm, seq)
    assert seq.block_keys == []
    seq.add_pending_token(0, is_last=False)  # sampled on the device: its block cannot be keyed yet
    bm.allocate(seq, 1)
    assert seq.block_tables[0] == [0] and seq.block_keys == []
    seq.num_computed_tokens = 4
    seq.resolve_pending_token(4)  # reaches the host
    seq.add_pending_token(0, is_last=False)
    assert bm.pools[0].num_blocks_to_append(seq.block_tables[0], 4, 5) == 1
    bm.allocate(seq, 1)  # the next allocation keys the block the known token filled
    assert seq.block_tables[0] == [0, 1] and len(seq.block_keys) == 1


def test_prefix_caching_disabled_keys_nothing() -> None:
    bm = BlockManager([KVCacheGroup(None, 8)], BLOCK, enable_prefix_caching=False)
    a = make_seq(list(range(9)), "a")
    admit(bm, a)
    bm.free(a)
    assert not bm.pools[0].key_to_block and not bm.pools[0].evictable_ids
    assert bm.match_prefix(make_seq(list(range(9)), "b")) == bm.no_hit()
    assert_idle(bm)


def test_num_blocks_to_admit_counts_evictable_hits() -> None:
    bm = full_attention(4)
    a = make_seq(list(range(9)), "a")
    admit(bm, a)
    bm.free(a)
    b = make_seq(list(range(9)), "b")
    hit = bm.match_prefix(b)
    # 2 evictable hits leave the pool, plus 1 new block for token 8.
    assert bm.pools[0].num_blocks_to_admit(hit.block_tables[0], 9) == 3
    assert bm.can_admit(b, hit, 1)


def test_windowed_group_releases_the_blocks_before_the_window() -> None:
    bm = full_and_windowed(16, 16)
    seq = make_seq(list(range(10)))
    admit(bm, seq)  # computes tokens 0..9 in one step: every block of the prompt, in both groups
    assert seq.block_tables == [[0, 1, 2], [0, 1, 2]]
    decode(bm, seq, 10)  # computes position 10, which sees 5..10: block 0 (tokens 0..3) is never read again
    windowed = bm.pools[1]
    assert windowed.null_block == 16
    assert seq.block_tables == [[0, 1, 2], [16, 1, 2]]
    assert windowed.ref_counts[0] == 0 and list(windowed.evictable_ids) == [0]  # keyed: it stays cached
    for token_id in range(11, 14):
        decode(bm, seq, token_id)  # position 13 sees 8..13: block 1 (4..7) goes too
    assert seq.block_tables == [[0, 1, 2, 3], [16, 16, 2, 3]]
    assert list(windowed.evictable_ids) == [0, 1]
    bm.free(seq)
    assert_idle(bm)


def test_windowed_blocks_held_stay_a_window_while_the_full_group_grows() -> None:
    bm = full_and_windowed(64, 64)
    seq = make_seq(list(range(5)))
    admit(bm, seq)
    for token_id in range(5, 200):
        decode(bm, seq, token_id)
        held = [b for b in seq.block_tables[1] if b != bm.pools[1].null_block]
        assert len(held) <= -(-WINDOW // BLOCK) + 1
        assert len(seq.block_tables[0]) == -(-seq.num_tokens // BLOCK)  # the pending token's block included
    assert bm.pools[1].num_blocks - bm.pools[1].num_available_blocks == 2
    bm.free(seq)
    assert_idle(bm)


def test_released_blocks_make_room_in_a_windowed_group_with_no_spare_block() -> None:
    """Two windowed blocks are enough to decode forever with a window of 5 (a query at 4k sees 4k - 4 .. 4k: two
    blocks): the step that takes block k releases block k - 2 first."""
    bm = BlockManager([KVCacheGroup(None, 64), KVCacheGroup(5, 2)], BLOCK)
    seq = make_seq(list(range(5)))
    admit(bm, seq)
    num_available = []
    for token_id in range(5, 60):
        decode(bm, seq, token_id)
        num_available.append(bm.pools[1].num_available_blocks)
    assert min(num_available) == 0  # every windowed block in use: only the released one made room
    bm.free(seq)
    assert_idle(bm)


def test_a_hit_takes_the_window_of_its_prefix_in_a_windowed_group() -> None:
    bm = full_and_windowed(16, 16)
    first = make_seq(list(range(20)), "a")
    admit(bm, first)
    bm.free(first)
    second = make_seq(list(range(20)) + [97, 98, 99], "b")
    hit = bm.match_prefix(second)
    # 5 blocks hit (tokens 0..19); position 20 sees 15..20: windowed blocks 3 and 4 (tokens 12..19) are needed.
    assert hit.num_blocks == 5
    assert hit.block_tables == [[0, 1, 2, 3, 4], [16, 16, 16, 3, 4]]
    assert bm.pools[0].num_blocks_to_admit(hit.block_tables[0], 23) == 6  # 5 evictable hits and 1 new block
    assert bm.pools[1].num_blocks_to_admit(hit.block_tables[1], 23) == 3
    admit(bm, second)
    assert second.num_computed_tokens == 23
    assert second.block_tables == [[0, 1, 2, 3, 4, 5], [16, 16, 16, 3, 4, 5]]
    assert bm.pools[1].ref_counts[:6] == [0, 0, 0, 1, 1, 1]
    bm.free(second)
    assert_idle(bm)


def test_a_windowed_block_evicted_before_the_full_ones_shortens_the_hit() -> None:
    bm = full_and_windowed(16, 6)
    first = make_seq(list(range(20)), "a")
    admit(bm, first)  # windowed blocks 0..4
    bm.free(first)  # evictable tail first: 4, 3, 2, 1, 0
    other = make_seq([500 + i for i in range(8)], "c")
    admit(bm, other)  # windowed: free block 5, then evicts 4
    assert other.block_tables[1] == [5, 4]
    hit = bm.match_prefix(make_seq(list(range(20)) + [97, 98, 99], "b"))
    # The full group still has 5 blocks, but a hit of 5 needs windowed block 4: 4 blocks (position 16 sees 11..16).
    assert hit.num_blocks == 4
    assert hit.block_tables == [[0, 1, 2, 3], [6, 6, 2, 3]]


def test_a_model_of_windowed_layers_only_hits_a_later_block_after_a_miss() -> None:
    bm = BlockManager([KVCacheGroup(WINDOW, 8)], BLOCK)
    first = make_seq(list(range(17)), "a")
    admit(bm, first)
    for token_id in range(17, 21):
        decode(bm, first, token_id)  # releases blocks 0, 1, 2 first: they become the least recently freed
    assert first.block_tables == [[8, 8, 8, 3, 4, 5]]
    bm.free(first)
    assert list(bm.pools[0].evictable_ids) == [0, 1, 2, 4, 3]
    other = make_seq([500 + i for i in range(16)], "c")
    admit(bm, other)  # free blocks 6, 7, 5, then evicts block 0
    assert other.block_tables == [[6, 7, 5, 0]]
    # Tokens 0..19 are 5 blocks; position 20 sees 15..20, in blocks 3 and 4: the miss of block 0 does not matter.
    hit = bm.match_prefix(make_seq(list(range(20)) + [97], "b"))
    assert hit.num_blocks == 5 and hit.block_tables == [[8, 8, 8, 3, 4]]


def test_preemption_frees_every_group() -> None:
    bm = full_and_windowed(16, 16)
    seq = make_seq(list(range(10)))
    admit(bm, seq)
    for token_id in range(10, 20):
        decode(bm, seq, token_id)
    bm.free(seq)
    assert seq.block_tables == [] and seq.block_keys == []
    assert_idle(bm)
    assert bm.num_used_blocks == 0 and bm.num_free_blocks + bm.num_evictable_blocks == 32


def test_a_waiting_sequence_hashes_its_blocks_once(monkeypatch) -> None:  # noqa: ANN001 - pytest's fixture
    """A sequence that waits is matched at every step (and again after a preemption): each block's key is hashed once
    in its life, and the keys its blocks get are the same."""
    import core.block_manager

    calls: list[int] = []

    def counting_block_key(parent_key: bytes | None, token_ids: list[int]) -> bytes:
        calls.append(1)
        return block_key(parent_key, token_ids)

    monkeypatch.setattr(core.block_manager, "block_key", counting_block_key)
    bm = BlockManager([KVCacheGroup(WINDOW, 16)], BLOCK)  # windowed layers only: every block of the prompt is matched
    seq = make_seq(list(range(37)))
    for _ in range(3):
        assert bm.match_prefix(seq).num_blocks == 0
    assert len(calls) == 9
    admit(bm, seq)
    bm.free(seq)
    admit(bm, seq)
    assert len(calls) == 9 and seq.block_keys == seq.chain_keys[:9]
    assert seq.block_keys[1] == block_key(block_key(None, [0, 1, 2, 3]), [4, 5, 6, 7])


def test_every_change_to_a_sequences_tables_gives_it_an_epoch_no_state_had() -> None:
    """Admitting, a new block, a windowed release, giving back a tail and freeing each give a new epoch; a step that
    changes no table (a decode whose token fits its blocks, the window releasing nothing) keeps it, so a runner
    rewrites nothing. Epochs are unique across managers."""
    bm, other = full_and_windowed(16, 16), full_attention(8)
    seq, elsewhere = make_seq([1, 2, 3]), make_seq([1, 2, 3], "s")
    seen = {seq.table_epoch}

    def changed() -> bool:
        fresh = seq.table_epoch not in seen
        seen.add(seq.table_epoch)
        return fresh

    admit(bm, seq)
    assert changed()
    kinds = set()
    for token in range(4, 16):
        before = [list(table) for table in seq.block_tables]
        decode(bm, seq, token)
        grew = len(seq.block_tables[0]) > len(before[0])
        released = seq.block_tables[1][: len(before[1])] != before[1]
        kinds.add((grew, released))
        assert changed() == (grew or released)
    assert {(False, False), (True, False), (False, True)} <= kinds  # each kind of step occurred
    bm.release_tail(seq, seq.num_tokens - 1)
    assert changed()
    admit(other, elsewhere)
    assert elsewhere.table_epoch not in seen
    bm.free(seq)
    assert changed()
