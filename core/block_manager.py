"""Paged KV-cache blocks per KV-cache group: allocation, reference counts and the prefix cache.

Groups (gpu/kv_cache_groups.py): the layers that keep the whole context (full attention) and those that keep a
sliding window W, each group with its own pool of block ids. A sequence holds one block table per group, every
table indexed by block position (entry i: tokens [i * block_size, (i + 1) * block_size)). In a windowed group,
once the next position to compute is p, a block wholly before p - W + 1 is read by no future query: allocating
releases it, and its entry names the group's null block (id num_blocks, never handed out). So a context costs the
full-attention layers' blocks plus a window (and a chunk) of the windowed layers'. The scheduler asks the manager
whether it can admit or append and never sees a group.

Prefix cache: a full block's key is blake2b(parent key, its token ids), one chain per sequence shared by the
groups; each group maps keys to its own blocks, and a hit is still checked against the block's stored token ids.
A hit of n blocks needs a full-attention group's blocks for all n, and a windowed group's blocks covering the
window of position n * block_size (the earlier ones may be gone: the hit is then the longest every group serves).
A block whose ref count drops to 0 keeps its key and contents and waits, evictable, for a hit; allocation takes
never-keyed free blocks first, then evicts the least recently freed keyed block (clearing its key).

What the manager asks of a group's pool (BlockPool): the blocks admitting a hit or appending tokens takes
(`num_blocks_to_admit`, `num_blocks_to_append`), to hold, append to and free a table, to key a full block and look a
key up (`register`, `cached_block`), the first block a query at a position reads (`first_kept_block`: 0 with full
attention; a hit must hold its group's blocks from there on), whether it keeps every block (`sliding_window` None:
the prefix chain stops at its first miss; else it may release blocks at any append), and its block counts. Another
kind of group answers the same questions: a linear-attention group (one recurrent state per sequence, a snapshot per
full block for hits) would have a first kept block of the hit's last one (the snapshot the hit resumes from) and
release the older ones.

Table epochs: every change the manager makes to a sequence's tables (admitting, appending blocks, a windowed group's
release, giving back a tail, freeing) gives the sequence a new `table_epoch`, from one counter of the process, so no
two states of any tables share a number; a runner that wrote a row's table at some epoch rewrites it only when the
row's epoch is another (gpu/host_to_device.py's WrittenTables).

Invariants, per group: a block is in exactly one of {in use (ref > 0), free (ref 0, no key), evictable (ref 0,
keyed)}; at idle every ref count is 0 and free + evictable = total. In a sequence's windowed table the null entries
are a prefix.
"""

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence as Sequence_
from dataclasses import dataclass
from itertools import accumulate, count

from core.sequence import Sequence
from gpu.kv_cache_groups import KVCacheGroup

# One counter for the process: engines (and restarted ones) never hand out the same epoch.
_TABLE_EPOCHS = count(1)


def block_key(parent_key: bytes | None, token_ids: list[int]) -> bytes:
    digest = hashlib.blake2b(parent_key or b"", digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


@dataclass(frozen=True)
class PrefixHit:
    """The cached blocks a sequence can start from: the keys of its first blocks and each group's blocks for them
    (a windowed group's null block before its window)."""

    keys: list[bytes]
    block_tables: list[list[int]]  # one per group

    @property
    def num_blocks(self) -> int:
        return len(self.keys)

    def leading(self, num_blocks: int) -> "PrefixHit":
        """The hit's first `num_blocks` blocks, for groups that keep whole contexts (a windowed group's would need the
        window before them): a hybrid model's hit ends where its linear layers' state was kept."""
        return PrefixHit(self.keys[:num_blocks], [table[:num_blocks] for table in self.block_tables])


class BlockPool:
    """One group's blocks: ref counts, free and evictable ids, and its part of the prefix cache."""

    def __init__(self, group: KVCacheGroup, block_size: int) -> None:
        self.num_blocks = group.num_blocks
        self.sliding_window = group.sliding_window
        self.block_size = block_size
        self.null_block = group.num_blocks if group.sliding_window is not None else None
        self.ref_counts = [0] * group.num_blocks
        self.block_keys: list[bytes | None] = [None] * group.num_blocks
        self.block_token_ids: list[tuple[int, ...] | None] = [None] * group.num_blocks
        self.free_ids: deque[int] = deque(range(group.num_blocks))
        self.evictable_ids: OrderedDict[int, None] = OrderedDict()  # least recently freed first
        self.key_to_block: dict[bytes, int] = {}

    @property
    def num_available_blocks(self) -> int:
        return len(self.free_ids) + len(self.evictable_ids)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    @property
    def num_evictable_blocks(self) -> int:
        return len(self.evictable_ids)

    def first_kept_block(self, next_position: int) -> int:
        """The first block a query at `next_position` or later may read (0 in a full-attention group)."""
        if self.sliding_window is None:
            return 0
        return max(0, next_position - self.sliding_window + 1) // self.block_size

    def cached_block(self, key: bytes, token_ids: list[int]) -> int | None:
        block_id = self.key_to_block.get(key)
        return None if block_id is None or self.block_token_ids[block_id] != tuple(token_ids) else block_id

    def num_blocks_to_admit(self, hit_ids: list[int], num_tokens: int) -> int:
        """Blocks taken from the available ones by holding `hit_ids` and covering `num_tokens` tokens."""
        num_evictable_hits = sum(1 for b in hit_ids if b != self.null_block and self.ref_counts[b] == 0)
        return num_evictable_hits + -(-num_tokens // self.block_size) - len(hit_ids)

    def hold(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            if block_id == self.null_block:
                continue
            if self.ref_counts[block_id] == 0:
                del self.evictable_ids[block_id]
            self.ref_counts[block_id] += 1

    def num_blocks_to_append(self, table: list[int], next_position: int, num_tokens: int) -> int:
        """Blocks taken from the available ones by covering `num_tokens` tokens, net of the blocks before the window
        that only this table holds (released first)."""
        needed = -(-num_tokens // self.block_size) - len(table)
        if needed <= 0 or self.sliding_window is None:  # nothing taken (the common decode), or nothing released
            return max(0, needed)
        out_of_window = self._blocks_out_of_window(table, next_position)
        return needed - sum(1 for index in out_of_window if self.ref_counts[table[index]] == 1)

    def append(self, table: list[int], next_position: int, num_tokens: int) -> bool:
        """Releases the table's blocks before the window of `next_position`, then covers `num_tokens` tokens;
        whether the table changed."""
        changed = False
        if self.sliding_window is not None:
            for index in self._blocks_out_of_window(table, next_position):
                self._release(table[index])
                table[index] = self.null_block  # type: ignore[assignment]
                changed = True
        for _ in range(-(-num_tokens // self.block_size) - len(table)):
            table.append(self._take_block())
            changed = True
        return changed

    def release_tail(self, table: list[int], num_kept: int) -> None:
        """Gives back the table's blocks past its first `num_kept` (those of rejected draft tokens): never keyed, as
        they held no token known on the host when they were taken, and never null (the window ends later)."""
        for block_id in table[num_kept:]:
            assert self.ref_counts[block_id] == 1 and self.block_keys[block_id] is None
            self.ref_counts[block_id] = 0
            self.free_ids.append(block_id)
        del table[num_kept:]

    def free(self, table: list[int], keep_cached: bool) -> None:
        """Drops a table's references; a block nobody else holds stays in the prefix cache if it is keyed and
        `keep_cached` (False: its contents are not to be trusted)."""
        # Tail blocks first, so they become the least recent and are evicted before shared prefixes.
        for block_id in reversed(table):
            if block_id == self.null_block:
                break  # the null entries are a prefix
            self._release(block_id, keep_cached)

    def register(self, index: int, table: list[int], key: bytes, token_ids: list[int]) -> None:
        """Keys the table's block `index` (a full block of known tokens), unless an equal block has the key."""
        block_id = table[index]
        if block_id != self.null_block and key not in self.key_to_block:
            self.key_to_block[key] = block_id
            self.block_keys[block_id] = key
            self.block_token_ids[block_id] = tuple(token_ids)

    def _blocks_out_of_window(self, table: list[int], next_position: int) -> range:
        """The indices of the table's blocks (not yet released) that lie wholly before the window."""
        end = min(self.first_kept_block(next_position), len(table))
        start = end
        while start > 0 and table[start - 1] != self.null_block:
            start -= 1
        return range(start, end)

    def _release(self, block_id: int, keep_cached: bool = True) -> None:
        self.ref_counts[block_id] -= 1
        if self.ref_counts[block_id] == 0:
            if self.block_keys[block_id] is not None and not keep_cached:
                self._forget(block_id)
            if self.block_keys[block_id] is None:
                self.free_ids.append(block_id)
            else:
                self.evictable_ids[block_id] = None

    def _take_block(self) -> int:
        if self.free_ids:
            block_id = self.free_ids.popleft()
        else:
            block_id, _ = self.evictable_ids.popitem(last=False)
            self._forget(block_id)
        assert self.ref_counts[block_id] == 0
        self.ref_counts[block_id] = 1
        return block_id

    def _forget(self, block_id: int) -> None:
        """Takes a keyed block out of the prefix cache."""
        del self.key_to_block[self.block_keys[block_id]]  # type: ignore[index]
        self.block_keys[block_id] = None
        self.block_token_ids[block_id] = None


class BlockManager:
    def __init__(self, groups: Sequence_[KVCacheGroup], block_size: int, enable_prefix_caching: bool = True) -> None:
        assert groups, "a model keeps at least one KV-cache group"
        self.pools = [BlockPool(group, block_size) for group in groups]
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._is_windowed_only = all(pool.sliding_window is not None for pool in self.pools)

    # Summed over the groups (the engine's stats and metrics).

    @property
    def num_blocks(self) -> int:
        return sum(pool.num_blocks for pool in self.pools)

    @property
    def num_free_blocks(self) -> int:
        return sum(pool.num_free_blocks for pool in self.pools)

    @property
    def num_evictable_blocks(self) -> int:
        return sum(pool.num_evictable_blocks for pool in self.pools)

    @property
    def num_used_blocks(self) -> int:
        return sum(pool.num_blocks - pool.num_available_blocks for pool in self.pools)

    def match_prefix(self, seq: Sequence) -> PrefixHit:
        """The cached blocks of the longest prefix of `seq` every group can serve, leaving its last token uncached
        (it must be computed to sample the next one). Takes no references."""
        keys = self._cached_chain(seq) if self.enable_prefix_caching else []
        if not keys:
            return self.no_hit()
        tables = [[pool.cached_block(key, self._tokens(seq, i)) for i, key in enumerate(keys)] for pool in self.pools]
        # Per group, [n]: the last block before n that it has not cached (-1: none). A hit of n blocks needs none
        # from the group's first kept block on.
        last_missing = [list(accumulate((i if b is None else -1 for i, b in enumerate(table)), max, initial=-1))
                        for table in tables]
        num_blocks = len(keys)
        while num_blocks and any(missing[num_blocks] >= pool.first_kept_block(num_blocks * self.block_size)
                                 for pool, missing in zip(self.pools, last_missing, strict=True)):
            num_blocks -= 1
        return PrefixHit(keys[:num_blocks], [self._hit_table(pool, table[:num_blocks])
                                             for pool, table in zip(self.pools, tables, strict=True)])

    def no_hit(self) -> PrefixHit:
        return PrefixHit([], [[] for _ in self.pools])

    def can_admit(self, seq: Sequence, hit: PrefixHit, num_new_tokens: int) -> bool:
        """Whether every group has the blocks to admit `seq` with these hits and compute `num_new_tokens` more."""
        num_tokens = hit.num_blocks * self.block_size + num_new_tokens
        return all(pool.num_blocks_to_admit(table, num_tokens) <= pool.num_available_blocks
                   for pool, table in zip(self.pools, hit.block_tables, strict=True))

    def admit(self, seq: Sequence, hit: PrefixHit) -> None:
        """Gives a sequence that holds no blocks its prefix-cache hits."""
        assert not seq.block_tables, "a sequence is admitted with empty block tables"
        for pool, table in zip(self.pools, hit.block_tables, strict=True):
            pool.hold(table)
        seq.block_tables = [list(table) for table in hit.block_tables]
        seq.table_epoch = next(_TABLE_EPOCHS)
        seq.block_keys = list(hit.keys)
        seq.num_computed_tokens = hit.num_blocks * self.block_size

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether every group has the blocks for `num_new_tokens` more tokens of the running `seq`."""
        start = seq.num_computed_tokens
        end = start + num_new_tokens
        num_blocks = -(-end // self.block_size)
        for pool, table in zip(self.pools, seq.block_tables, strict=True):  # asked for every row of every step:
            if num_blocks > len(table) and pool.num_blocks_to_append(table, start, end) > pool.num_available_blocks:
                return False  # (a row whose blocks hold its new tokens, as most decodes, makes no call)
        return True

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Covers tokens [0, num_computed + num_new) with blocks in every group (a windowed group releasing those
        before its window first), and keys the full blocks whose tokens are all known on the host (a block holding a
        pending token is keyed by a later allocation)."""
        start = seq.num_computed_tokens
        end = start + num_new_tokens
        num_blocks = -(-end // self.block_size)
        changed = False
        for pool, table in zip(self.pools, seq.block_tables, strict=True):
            if num_blocks > len(table) or pool.sliding_window is not None:  # else nothing to do (most decodes)
                changed = pool.append(table, start, end) or changed
        if changed:
            seq.table_epoch = next(_TABLE_EPOCHS)
        if self.enable_prefix_caching and min(end, len(seq.token_ids)) // self.block_size > len(seq.block_keys):
            self._key_full_blocks(seq, end)

    def release_tail(self, seq: Sequence, num_tokens: int) -> None:
        """Gives back, in every group, the sequence's blocks past its first `num_tokens` tokens (those of rejected
        draft tokens). A windowed group released blocks only before the window of the step's first position, which
        no kept token precedes, so none a later query reads is gone."""
        num_kept = -(-num_tokens // self.block_size)
        for pool, table in zip(self.pools, seq.block_tables, strict=True):
            pool.release_tail(table, num_kept)
        seq.table_epoch = next(_TABLE_EPOCHS)

    def free(self, seq: Sequence, keep_cached: bool = True) -> None:
        """Drops the sequence's references in every group (`keep_cached`: see BlockPool.free); a waiting sequence
        holds none."""
        for pool, table in zip(self.pools, seq.block_tables, strict=False):
            pool.free(table, keep_cached)
        seq.block_tables = []
        seq.table_epoch = next(_TABLE_EPOCHS)
        seq.block_keys = []

    def _cached_chain(self, seq: Sequence) -> list[bytes]:
        """The keys of the sequence's first full blocks (its last token left out) up to the first that a
        full-attention group has not cached; without such a group, of all of them (a windowed group may keep a
        later block and not an earlier one)."""
        num_blocks = (seq.num_tokens - 1) // self.block_size
        if self._is_windowed_only:
            return [self._chain_key(seq, index) for index in range(num_blocks)]
        keys: list[bytes] = []
        for index in range(num_blocks):
            key, token_ids = self._chain_key(seq, index), self._tokens(seq, index)
            if any(pool.cached_block(key, token_ids) is None for pool in self.pools if pool.sliding_window is None):
                break
            keys.append(key)
        return keys

    def _chain_key(self, seq: Sequence, index: int) -> bytes:
        """The key of the sequence's full block `index` (its tokens known), hashed once per sequence."""
        keys = seq.chain_keys
        while len(keys) <= index:
            assert (len(keys) + 1) * self.block_size <= len(seq.token_ids), "a key is of a full block of known tokens"
            keys.append(block_key(keys[-1] if keys else None, self._tokens(seq, len(keys))))
        return keys[index]

    def _hit_table(self, pool: BlockPool, cached: list[int | None]) -> list[int]:
        """A group's table for a hit: its cached blocks, the null block before its window."""
        first = pool.first_kept_block(len(cached) * self.block_size)
        return [pool.null_block] * first + cached[first:]  # type: ignore[list-item]

    def _tokens(self, seq: Sequence, index: int) -> list[int]:
        return seq.token_ids[index * self.block_size : (index + 1) * self.block_size]

    def _key_full_blocks(self, seq: Sequence, num_covered_tokens: int) -> None:
        num_full_blocks = min(num_covered_tokens, len(seq.token_ids)) // self.block_size
        for index in range(len(seq.block_keys), num_full_blocks):
            token_ids = self._tokens(seq, index)
            key = self._chain_key(seq, index)
            seq.block_keys.append(key)
            for pool, table in zip(self.pools, seq.block_tables, strict=True):
                pool.register(index, table, key, token_ids)  # an equal block computed twice stays unkeyed
