"""Launch parameters of the fused MoE GEMMs (gpu/kernels/fused_moe.py), per row-count bucket.

A step's tokens are padded up to a power-of-two bucket and one config serves the bucket (per expert shape), so
decode graphs and the mixed graphs' token buckets compile a handful of configs. The tile of rows (`block_m`) is also
the alignment of each expert's run of pairs (gpu/kernels/moe_align.py), so the gate/up and down GEMMs of a step
share it; their column and K tiles are their own.

The rule (`default_config`): while a step has few pairs per expert, tiles of 16 rows (each expert's weight is
streamed once for its few rows: the GEMMs are bandwidth-bound, and wider column tiles let fewer programs cover
it); with more pairs per expert, taller row tiles, so each weight tile is reused over more rows. A GPU's measured
table (`python -m bench.kernels.fused_moe --sweep`), keyed by (bucket, experts, intermediate size per rank,
hidden size), overrides the rule where it has the key (none measured so far). The decode kernels' tiles
(gpu/kernels/moe_decode.py) likewise: the rule `decode_tiles`, overridden per GPU by DECODE_TABLES, keyed by the
step's (tokens, top k, intermediate size per rank, hidden size). This module needs no triton.
"""

from dataclasses import dataclass

from gpu.kernels.device_tables import table_named


@dataclass(frozen=True)
class GemmTiles:
    block_n: int
    block_k: int
    group_m: int = 1  # row tiles that share a column tile's weight in launch order (L2 reuse)
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class MoeConfig:
    block_m: int
    gate_up: GemmTiles  # block_n counts activated columns: the gate's and the up's tiles each have block_n
    down: GemmTiles


Table = dict[tuple[int, int, int, int], MoeConfig]  # (row bucket, experts, intermediate, hidden) -> config


def row_bucket(num_tokens: int) -> int:
    return 1 << max(0, num_tokens - 1).bit_length()


def default_config(bucket: int, num_experts: int, top_k: int) -> MoeConfig:
    """The rule of this module's docstring, over pairs per expert at the bucket's size."""
    pairs_per_expert = bucket * top_k / num_experts
    if pairs_per_expert <= 4:
        return MoeConfig(16, GemmTiles(32, 128, num_stages=4), GemmTiles(64, 128, num_stages=4))
    if pairs_per_expert <= 16:
        return MoeConfig(16, GemmTiles(64, 64, num_stages=4), GemmTiles(128, 64, num_stages=4))
    if pairs_per_expert <= 64:
        return MoeConfig(32, GemmTiles(64, 64, group_m=4), GemmTiles(128, 64, group_m=4))
    if pairs_per_expert <= 256:
        return MoeConfig(64, GemmTiles(64, 64, group_m=8, num_warps=8), GemmTiles(128, 64, group_m=8, num_warps=8))
    return MoeConfig(128, GemmTiles(64, 64, group_m=8, num_warps=8), GemmTiles(128, 64, group_m=8, num_warps=8))


# Device name -> the grouped path's tiles measured fastest there (`python -m bench.kernels.fused_moe --sweep`), per
# row bucket; a bucket not in its table takes the rule. H100 80GB HBM3: Qwen3-30B-A3B's experts at 256-8192 rows.
TABLES: dict[str, Table] = {"H100": {
    (256, 128, 768, 2048): MoeConfig(64, GemmTiles(64, 128, group_m=1, num_warps=8, num_stages=4),
                                   GemmTiles(128, 128, group_m=1, num_warps=4, num_stages=4)),
    (512, 128, 768, 2048): MoeConfig(64, GemmTiles(64, 128, group_m=1, num_warps=8, num_stages=4),
                                   GemmTiles(64, 128, group_m=8, num_warps=4, num_stages=3)),
    (1024, 128, 768, 2048): MoeConfig(64, GemmTiles(64, 64, group_m=1, num_warps=4, num_stages=3),
                                   GemmTiles(128, 64, group_m=4, num_warps=4, num_stages=3)),
    (2048, 128, 768, 2048): MoeConfig(128, GemmTiles(128, 64, group_m=1, num_warps=8, num_stages=4),
                                   GemmTiles(256, 64, group_m=8, num_warps=8, num_stages=4)),
    (4096, 128, 768, 2048): MoeConfig(128, GemmTiles(128, 64, group_m=1, num_warps=8, num_stages=4),
                                   GemmTiles(256, 64, group_m=1, num_warps=8, num_stages=4)),
    (8192, 128, 768, 2048): MoeConfig(128, GemmTiles(128, 64, group_m=1, num_warps=8, num_stages=4),
                                   GemmTiles(256, 64, group_m=8, num_warps=8, num_stages=4)),
}}


def config_for(num_tokens: int, num_experts: int, top_k: int, intermediate: int, hidden: int,
               device_name: str = "") -> MoeConfig:
    """The config of a step of `num_tokens` through experts [num_experts, 2 * intermediate, hidden] on the named GPU:
    its table's, else the rule's."""
    bucket = row_bucket(num_tokens)
    table = table_named(TABLES, device_name) or {}
    return table.get((bucket, num_experts, intermediate, hidden)) or default_config(bucket, num_experts, top_k)


@dataclass(frozen=True)
class DecodeTiles:
    """Tiles of one decode kernel (gpu/kernels/moe_decode.py): `block_n` output columns by `block_k` of K a step."""

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 1  # the K loop's software pipelining (tl.range's num_stages): 1, none
    # The down kernel only: a token's slots split over this many programs per column tile, each writing its float32
    # sum for a second pass to add in slot order (more programs at one token, and still no atomics).
    slot_groups: int = 1


@dataclass(frozen=True)
class DecodeConfig:
    gate_up: DecodeTiles  # over (token, slot) pairs x intermediate columns, K = hidden
    down: DecodeTiles  # over tokens x hidden columns, K = intermediate


DecodeTable = dict[tuple[int, int, int, int], DecodeConfig]  # (tokens, top k, intermediate, hidden) -> tiles
# Device name -> the decode kernels' tiles measured fastest there (`python -m bench.kernels.fused_moe --sweep`).
# H100 80GB HBM3: Qwen3-30B-A3B's experts at one and two tokens.
DECODE_TABLES: dict[str, DecodeTable] = {"H100": {
    (1, 8, 768, 2048): DecodeConfig(gate_up=DecodeTiles(4, 512, num_warps=8), down=DecodeTiles(8, 256, num_warps=8)),
    (2, 8, 768, 2048): DecodeConfig(gate_up=DecodeTiles(8, 256, num_warps=4),
                                    down=DecodeTiles(16, 128, num_warps=8, slot_groups=2)),
}}

DECODE_PROGRAMS = 512  # programs a decode kernel aims for: a few per multiprocessor, each streaming its rows
DECODE_TILE_ELEMENTS = 8192  # a tile's elements: its float32 sums take 32 registers a thread at 8 warps


def uses_decode_path(num_tokens: int, top_k: int, num_experts: int) -> bool:
    """Whether a step's experts run as one GEMV per (token, slot) pair (gpu/kernels/moe_decode.py) rather than as
    grouped GEMMs over pairs sorted by expert. A pair reads its expert's weights itself, so two pairs on one expert
    read it twice where a grouped tile reads it once: one token's pairs never share an expert, and up to an eighth of
    the experts in pairs few do (Qwen3-30B-A3B: 2 tokens of 8 of 128; gpt-oss: 1 of 4 of 32). Past that the grouped
    GEMMs' shared reads win (bench/kernels/fused_moe.py times both)."""
    return num_tokens * top_k <= max(top_k, num_experts // 8)


def decode_tiles(num_units: int, columns: int, k: int) -> DecodeTiles:
    """The widest column tile (8 to 64) that still gives `num_units` (pairs or tokens) x column tiles at least
    DECODE_PROGRAMS programs (bandwidth-bound: programs, not tile width, fill the GPU); K tiles up to the whole K
    within DECODE_TILE_ELEMENTS; 8 warps from 4096 elements (32 a thread), else 4."""
    block_n = 64
    while block_n > 8 and num_units * -(-columns // block_n) < DECODE_PROGRAMS:
        block_n //= 2
    block_k = min(1 << max(0, k - 1).bit_length(), DECODE_TILE_ELEMENTS // block_n)
    return DecodeTiles(block_n, block_k, 8 if block_n * block_k >= 4096 else 4)


def default_decode_config(num_tokens: int, top_k: int, intermediate: int, hidden: int) -> DecodeConfig:
    """The rule's tiles for both decode kernels of a step."""
    return DecodeConfig(decode_tiles(num_tokens * top_k, intermediate, hidden),
                        decode_tiles(num_tokens, hidden, intermediate))


def decode_config(num_tokens: int, top_k: int, intermediate: int, hidden: int, device_name: str = "") -> DecodeConfig:
    """The decode kernels' tiles of a step of `num_tokens` on the named GPU: its table's, else the rule's. Tokens are
    not bucketed: the decode path takes only a few token counts, each its own key."""
    key = (num_tokens, top_k, intermediate, hidden)
    return (table_named(DECODE_TABLES, device_name) or {}).get(key) or default_decode_config(*key)
