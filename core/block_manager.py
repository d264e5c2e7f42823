"""Paged KV-cache blocks: allocation, reference counts and the prefix cache.

A full block's key is blake2b(parent key, its token ids): equal keys mean equal prefixes, and a hit
is still checked against the block's stored token ids. A block whose ref count drops to 0 keeps its
key and contents and waits, evictable, for a prefix hit; allocation takes never-keyed free blocks
first, then evicts the least recently freed keyed block (clearing its key).

Invariants: a block is in exactly one of {in use (ref > 0), free (ref 0, no key), evictable
(ref 0, keyed)}; at idle every ref count is 0 and free + evictable = total.
"""

import hashlib
from array import array
from collections import OrderedDict, deque

from core.sequence import Sequence


def block_key(parent_key: bytes | None, token_ids: list[int]) -> bytes:
    digest = hashlib.blake2b(parent_key or b"", digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_keys: list[bytes | None] = [None] * num_blocks
        self.block_token_ids: list[tuple[int, ...] | None] = [None] * num_blocks
        self.free_ids: deque[int] = deque(range(num_blocks))
        self.evictable_ids: OrderedDict[int, None] = OrderedDict()  # least recently freed first
        self.key_to_block: dict[bytes, int] = {}

    @property
    def num_available_blocks(self) -> int:
        return len(self.free_ids) + len(self.evictable_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_available_blocks

    def match_prefix(self, seq: Sequence) -> tuple[list[int], list[bytes]]:
        """The cached blocks of the longest cached prefix of `seq`, leaving its last token uncached
        (it must be computed to sample the next one). Takes no references."""
        if not self.enable_prefix_caching:
            return [], []
        block_ids: list[int] = []
        keys: list[bytes] = []
        parent = None
        for start in range(0, seq.num_tokens - 1 - self.block_size + 1, self.block_size):
            token_ids = seq.token_ids[start : start + self.block_size]
            key = block_key(parent, token_ids)
            block_id = self.key_to_block.get(key)
            if block_id is None or self.block_token_ids[block_id] != tuple(token_ids):
                break
            block_ids.append(block_id)
            keys.append(key)
            parent = key
        return block_ids, keys

    def num_blocks_to_admit(self, seq: Sequence, hit_ids: list[int], num_new_tokens: int) -> int:
        """Blocks taken from the available pool by admitting `seq` with these hits."""
        num_evictable_hits = sum(1 for b in hit_ids if self.ref_counts[b] == 0)
        needed = -(-(len(hit_ids) * self.block_size + num_new_tokens) // self.block_size)
        return num_evictable_hits + needed - len(hit_ids)

    def admit(self, seq: Sequence, hit_ids: list[int], hit_keys: list[bytes]) -> None:
        """Gives a sequence that holds no blocks its prefix-cache hits."""
        assert not seq.block_ids, "a sequence is admitted with an empty block table"
        for block_id in hit_ids:
            if self.ref_counts[block_id] == 0:
                del self.evictable_ids[block_id]
            self.ref_counts[block_id] += 1
        seq.block_ids = list(hit_ids)
        seq.block_keys = list(hit_keys)
        seq.num_computed_tokens = len(hit_ids) * self.block_size

    def num_blocks_to_append(self, seq: Sequence, num_new_tokens: int) -> int:
        needed = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, needed - len(seq.block_ids))

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks == 0 or num_blocks <= self.num_available_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Covers tokens [0, num_computed + num_new) with blocks and keys the full ones whose tokens are
        all known on the host (a block holding a pending token is keyed by a later allocation)."""
        for _ in range(self.num_blocks_to_append(seq, num_new_tokens)):
            seq.block_ids.append(self._take_block())
        self._key_full_blocks(seq, seq.num_computed_tokens + num_new_tokens)

    def release_tail(self, seq: Sequence, num_tokens: int) -> None:
        """Gives back the sequence's blocks past its first `num_tokens` tokens (those of rejected draft
        tokens): never keyed, as they hold no token known on the host when they were allocated."""
        num_kept = -(-num_tokens // self.block_size)
        for block_id in seq.block_ids[num_kept:]:
            assert self.ref_counts[block_id] == 1 and self.block_keys[block_id] is None
            self.ref_counts[block_id] = 0
            self.free_ids.append(block_id)
        del seq.block_ids[num_kept:]

    def free(self, seq: Sequence, keep_cached: bool = True) -> None:
        """Drops the sequence's references; a block nobody else holds stays in the prefix cache if it is
        keyed and `keep_cached` (False: its contents are not to be trusted)."""
        # Tail blocks first, so they become the least recent and are evicted before shared prefixes.
        for block_id in reversed(seq.block_ids):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                if self.block_keys[block_id] is not None and not keep_cached:
                    self._forget(block_id)
                if self.block_keys[block_id] is None:
                    self.free_ids.append(block_id)
                else:
                    self.evictable_ids[block_id] = None
        seq.block_ids = []
        seq.block_keys = []

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

    def _key_full_blocks(self, seq: Sequence, num_covered_tokens: int) -> None:
        num_full_blocks = min(num_covered_tokens, len(seq.token_ids)) // self.block_size
        if num_full_blocks <= len(seq.block_keys) or not self.enable_prefix_caching:
            return
        for index in range(len(seq.block_keys), num_full_blocks):
            token_ids = seq.token_ids[index * self.block_size : (index + 1) * self.block_size]
            key = block_key(seq.block_keys[-1] if seq.block_keys else None, token_ids)
            seq.block_keys.append(key)
            block_id = seq.block_ids[index]
            if key not in self.key_to_block:  # an equal block computed twice stays unkeyed
                self.key_to_block[key] = block_id
                self.block_keys[block_id] = key
                self.block_token_ids[block_id] = tuple(token_ids)
