"""KV-cache groups: the attention layers grouped by what they keep of a sequence's context.

- Full attention: a block for every token of the context.
- Sliding window W: blocks for the last W tokens only. With p the next position to compute, keys at positions
  <= p - W are read by no future query, so a block wholly before p - W + 1 is freed (core/block_manager.py) and its
  block-table entry names the group's null block instead: the block past the group's last one, zeros, never
  written, which a backend may read but always masks (gpu/attention/variant.py). One group per distinct W; a
  window at least as long as the context frees nothing, and its layers join the full-attention group.

Group 0 is the full-attention group where the model has full-attention layers, then the windows, shortest first. A
layer that reads another layer's cache (Gemma 4's shared KV) is in that layer's group.

Layout: one pool of blocks per group. A group's block ids are its own (0 .. num_blocks - 1, then its null block),
its K/V tensors are its layers' only ([num_blocks (+ 1), block_size, kv_heads, head_dim] per layer), and each layer
reads its group's slot mapping and block tables (AttentionMetadata.of_group). vLLM's hybrid allocator instead
shares one pool of block ids among the groups, one physical block serving one layer of each group (groups padded to
equal layer counts), so memory flows to whichever group needs it. We do not, because a windowed group's need is
bounded: at most `windowed_need` blocks (max_num_seqs windows plus the chunks of two steps), so sizing each windowed
group to that and giving the full-attention group the rest (gpu/kv_cache.py) costs little, while one shared pool
needs every layer's block to have one size (Gemma 4's full layers have other head sizes than its sliding ones) and
splits a group of same-window layers into several tables. Per-group pools keep a windowed layer's cache a plain
tensor and the one-group model (Llama, Qwen) exactly as it was.

Beside these a state group can stand (linear attention: one recurrent and conv state per sequence instead of
blocks, snapshots at block boundaries for prefix hits): another kind of group with its own pool and accounting in
the block manager, and its own per-row inputs in a step, which the engine learns of through `KVCacheGroup`.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpu.layers.attention import DecoderAttention


@dataclass(frozen=True)
class KVCacheGroup:
    """What the engine knows of a group: the window its layers keep (None: the whole context) and its blocks."""

    sliding_window: int | None
    num_blocks: int

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError(f"a KV-cache group needs at least one block, got {self.num_blocks}")


def group_windows(layers: Sequence["DecoderAttention"], max_model_len: int) -> tuple[int | None, ...]:
    """Each group's window, in group order: None (full attention) first where a layer keeps the whole context."""
    windows = {_kept(layer.spec.sliding_window, max_model_len) for layer in layers if layer.owns_kv_cache}
    return tuple(sorted(windows, key=lambda w: -1 if w is None else w))


def assign_groups(layers: Sequence["DecoderAttention"], windows: tuple[int | None, ...], max_model_len: int) -> None:
    """Sets each layer's `kv_group`: its window's group, or the group of the layer whose cache it reads."""
    for layer in layers:
        if layer.owns_kv_cache:
            layer.kv_group = windows.index(_kept(layer.spec.sliding_window, max_model_len))
    for layer in layers:
        if (source := layer.kv_source) is not None:
            layer.kv_group = source.kv_group


def most_blocks_of_one_sequence(window: int | None, block_size: int, max_model_len: int,
                                max_num_batched_tokens: int) -> int:
    """The most blocks of a group one sequence holds at once: a full-attention group its whole context; a windowed
    group the blocks from its window's start to the end of its step's chunk (after the blocks before the window
    are freed), no more than its context's."""
    context = -(-max_model_len // block_size)
    if window is None:
        return context
    chunk = min(max_num_batched_tokens, max_model_len)
    # Blocks of positions [p - W + 1, p + chunk): (W + chunk - 2) // bs + 2 at most, where the span straddles blocks.
    return min(context, (max(window - 2, 0) + chunk) // block_size + 2)


def windowed_need(window: int, block_size: int, max_num_seqs: int, max_model_len: int,
                  max_num_batched_tokens: int) -> int:
    """The most blocks a windowed group can hold at once over all sequences: each running sequence its window's
    blocks (two more where the window straddles blocks and a chunk starts mid-block) and the blocks of two steps'
    chunks (a sequence whose last chunk ran may hold it until its next step), no more than full contexts."""
    per_sequence = max(window - 2, 0) // block_size + 3
    chunks = 2 * -(-max_num_batched_tokens // block_size)
    return min(max_num_seqs * -(-max_model_len // block_size), max_num_seqs * per_sequence + chunks)


def context_block_limit(groups: Sequence[KVCacheGroup], block_size: int, max_model_len: int,
                        max_num_batched_tokens: int) -> int:
    """The most blocks one request's context may span (prompt and output, counted as a full-attention layer keeps
    them) so that every group can hold it alone: a full-attention group's blocks; a windowed group bounds it only
    when it cannot hold one sequence's window and chunk."""
    context = -(-max_model_len // block_size)
    limits = [g.num_blocks if g.num_blocks < most_blocks_of_one_sequence(
        g.sliding_window, block_size, max_model_len, max_num_batched_tokens) else context for g in groups]
    return min(limits)


def _kept(window: int | None, max_model_len: int) -> int | None:
    """A layer's window as its group knows it: None when it spans every context."""
    return None if window is None or window >= max_model_len else window
