"""Tile configurations shared by the Triton GEMM families (the profiler sweeps these)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class TileConfig:
    """One launch shape. Kernels run swap-AB: the weight tile [BN, BK] is the MMA's A operand
    (dequantized in registers), the activations [BK, BM] are B, so M may be as small as 16."""

    bm: int = 16  # token tile; the fragment kernel (1..16 tokens): weight rows per warp (8, 16 or 32)
    bn: int = 64
    bk: int = 128
    split_k: int = 1  # >1: K split over programs, partials summed by the last one (splitk.py)
    warps: int = 4
    stages: int = 3
    scale_after: bool = True  # int4: scale/min applied to the per-tile partial sum, not per weight
    join: bool = True  # int4: interleave the two nibbles in registers, load x [BK, BM] contiguous along K
    prefetch: bool = False  # CUDA-core GEMV: load the next K tile before this tile's math
    a_smem: bool = False  # wgmma kernel: dequantized tile through shared memory (overlaps the next dequant)
    maxnreg: int = 0  # wgmma kernel: register cap per thread (0: the compiler's), to fit more CTAs per SM
    kwarps: int = 1  # fragment kernel: warps of a CTA that share its rows, each over a K slice (summed in the CTA);
    # w4a8_progressive: 2 = its two consumer warpgroups share the rows, each over every other K tile
    stream_k: int = 0  # wgmma kernel: >0: a persistent grid of this many programs per SM, splitting the
    # (output tile, K tile) iterations evenly (stream-K: no partly filled last wave)
    hybrid: bool = False  # stream-K: each program first runs whole tiles, one per full wave of the
    # grid, and only the iterations of the tiles left over are split evenly
    preload: bool = False  # fragment kernel: a warp's whole K slice loaded before the PDL wait, not one
    # step ahead: with an early trigger its weights stream while the predecessor still runs
    pairs: bool = False  # fragment kernel: two blocks per loop trip, still one ahead (no register copies
    # at the loop's end; needs an even number of blocks per warp)
    xshare: bool = False  # fragment kernel: the row groups of a CTA load each block's activations once,
    # into shared memory, instead of every warp loading its own from L2
    ksum: bool = False  # fragment kernel (kwarps > 1, no split-K): the K slices summed through shared memory
    # of the kernel's own, one thread per output, not by tl.reduce and a join/cat epilogue
    trigger: int = -1  # fragment kernel: where its PDL successor is let in (1 at the start, 2 after the main
    # loop, 3 right after the PDL wait, 0 at exit); -1: `int4_mma_gemv.pdl_trigger`'s rule by M. Per shape,
    # since a linear's best point depends on what follows it (stop 49). Timing only: the bits never change

    def key(self) -> str:
        return (f"m{self.bm}n{self.bn}k{self.bk}s{self.split_k}w{self.warps}p{self.stages}"
                f"{'a' if self.scale_after else 'b'}{'j' if self.join else 's'}{'f' if self.prefetch else ''}"
                f"{'S' if self.a_smem else ''}{f'r{self.maxnreg}' if self.maxnreg else ''}"
                f"{f'q{self.kwarps}' if self.kwarps > 1 else ''}{f'z{self.stream_k}' if self.stream_k else ''}"
                f"{'h' if self.hybrid else ''}{'L' if self.preload else ''}{'T' if self.pairs else ''}"
                f"{'X' if self.xshare else ''}{'K' if self.ksum else ''}"
                f"{f't{self.trigger}' if self.trigger >= 0 else ''}")

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["kwarps"] == 1:  # the field came later: maps written before it keep their candidate names
            del d["kwarps"]
        if not d["stream_k"]:  # likewise
            del d["stream_k"]
        if not d["hybrid"]:  # likewise
            del d["hybrid"]
        if not d["preload"]:  # likewise
            del d["preload"]
        if not d["pairs"]:  # likewise
            del d["pairs"]
        if not d["xshare"]:  # likewise
            del d["xshare"]
        if not d["ksum"]:  # likewise
            del d["ksum"]
        if d["trigger"] < 0:  # likewise
            del d["trigger"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TileConfig":
        return cls(**d)


def block_m_for(m: int, cap: int) -> int:
    """Smallest power of two >= m (min 16: the MMA's minimum), at most cap."""
    b = 16
    while b < m and b < cap:
        b *= 2
    return b
