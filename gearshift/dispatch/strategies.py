"""The strategy registry: every kernel the dispatcher may pick, with its DPR bit partition.

A strategy serves one or more mode keys (`mode_key(store, act)`), says whether it can run a
given (store, act, config), lists the tile configs worth profiling at a given M, and runs.
All strategies compute the reference's function (`linear_reference`) up to accumulation order.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch
import torch.nn.functional as F

from gearshift.kernels.config import TileConfig, block_m_for
from gearshift.kernels.dpr import DPRPartition
from gearshift.kernels.reference import linear_reference
from gearshift.kernels.switches import s8_fragment_order_on
from gearshift.quant.activations import ActQuantSpec
from gearshift.quant.base import DenseWeight, WeightFormat
from gearshift.quant.int4 import ROWS, Int4Weight
from gearshift.quant.int8 import Int8Weight


def mode_key(store: WeightFormat, act: ActQuantSpec | None) -> str:
    """'w4a16', 'w4a8', 'w4a8fp8', 'w4a4', 'w8a16', 'w8a8', 'w16a16', ... from the store and act."""
    w = store.weight_bits
    if act is None:
        return f"w{w}a16"
    if act.group_size is not None:
        return f"w{w}a{act.bits}{act.dtype}g{act.group_size}"  # no kernel: reference only
    return f"w{w}a8fp8" if act.dtype == "fp8" else f"w{w}a{act.bits}"


def group_of(store: WeightFormat) -> int:
    return int(getattr(store, "group_size", 0) or 0)


@dataclass
class Strategy:
    name: str
    dpr: DPRPartition
    modes: tuple[str, ...]
    run: Callable[[torch.Tensor, WeightFormat, ActQuantSpec | None, TileConfig | None], torch.Tensor]
    configs: Callable[[int], list[TileConfig | None]] = field(default=lambda m: [None])
    supports: Callable[[WeightFormat, ActQuantSpec | None, TileConfig | None], bool] = field(
        default=lambda s, a, c: True)
    gpu_only: bool = True
    #: the kernel on activations already quantized per token (`ActCodes` from an RMSNorm), or None
    run_codes: Callable[[object, WeightFormat, TileConfig | None, torch.dtype], torch.Tensor] | None = None
    #: run_codes takes the codes as exact integers in the activations' bf16 / fp16 (else int8)
    codes_float: bool = False
    #: the kernel reads int8 codes in `x_tiles.S8_FRAGMENT_ORDER` (fewer instructions, the same bits) where
    #: `switches.s8_fragment_order_on()`: `reads_fragment_codes`
    codes_fragment_order: bool = False
    #: SwiGLU in the kernel's epilogue: (x2, gate_up store, config) -> silu(gate) * up [M, N / 2], or None
    #: where this tile has no such epilogue (the caller then runs gate_up and SwiGLU)
    run_glu: Callable[[torch.Tensor, WeightFormat, TileConfig | None], torch.Tensor | None] | None = None
    #: the same on activation codes (`ActCodes`, as `run_codes` takes them): (codes, store, config, out dtype)
    run_glu_codes: Callable[[object, WeightFormat, TileConfig | None, torch.dtype], torch.Tensor | None] | None = None
    #: the kernel on inputs in `x_tiles`' layout: (data, tokens, store, config) -> y [M, N], or None where this
    #: tile does not read them (the caller then runs `run` on the rows); where set, `run_glu` also takes
    #: x_tiles=M (inputs) and y_tiles=True (the product in the layout)
    run_tiles: Callable[[torch.Tensor, int, WeightFormat, TileConfig | None], torch.Tensor | None] | None = None


STRATEGIES: dict[str, Strategy] = {}


def reads_fragment_codes(s: Strategy) -> bool:
    """Whether the producers of s's activation codes store them in `x_tiles.S8_FRAGMENT_ORDER` (`CodesSpec`)."""
    return s.codes_fragment_order and s8_fragment_order_on()


def register(s: Strategy) -> Strategy:
    STRATEGIES[s.name] = s
    return s


def strategies_for(mode: str) -> list[Strategy]:
    return [s for s in STRATEGIES.values() if mode in s.modes]


# --- tile-config sweeps (small, fixed lists: the profiler times each) --------------------------

def a16_configs(m: int) -> list[TileConfig]:
    """Swap-AB configs for bf16 MMA: split-K GEMV-like tiles at small M, big tiles at large M."""
    if m <= 16:
        return [TileConfig(16, bn, bk, sk, w, 4, True, j)
                for bn, bk, sk, w, j in ((32, 512, 4, 4, True), (32, 256, 8, 4, True), (64, 256, 4, 4, True),
                                         (64, 512, 2, 8, True), (64, 128, 4, 4, True), (32, 512, 8, 4, True),
                                         (128, 256, 2, 8, True), (64, 128, 4, 4, False), (16, 512, 8, 4, True))]
    bm = block_m_for(m, 64)
    if m <= 64:  # swap-AB tiles of 64 weight rows, split-K to fill the SMs (midm.py sweep, stop 12)
        return [TileConfig(bm, bn, bk, sk, w, st, False, True) for bn, bk, sk, w, st in
                ((64, 128, 1, 4, 3), (64, 128, 2, 4, 3), (64, 128, 4, 4, 3), (64, 64, 4, 4, 4), (128, 128, 1, 4, 3),
                 (128, 128, 2, 8, 3), (64, 256, 4, 4, 4))] + [TileConfig(bm, 64, 256, sk, 4, 4, True, True)
                                                             for sk in (2, 4)]
    big = [TileConfig(256, 128, 64, 1, 8, st, False, True) for st in (3, 4)] if m >= 256 else []
    return [TileConfig(bm2, bn, bk, sk, w, st, False, True)
            for bm2 in sorted({block_m_for(m, 64), block_m_for(m, 128)})
            for bn, bk, sk, w, st in ((64, 128, 1, 4, 3), (64, 128, 2, 4, 3), (64, 128, 4, 4, 3), (128, 128, 1, 4, 3),
                                      (128, 128, 1, 8, 3), (256, 64, 1, 8, 3), (128, 64, 1, 8, 3))] + big


def a8_configs(m: int) -> list[TileConfig]:
    """int8/fp8 MMA tiles: BK >= 64 (32 per nibble half)."""
    if m <= 16:
        return [TileConfig(16, bn, bk, sk, w, 4, True, j)
                for bn, bk, sk, w, j in ((32, 512, 4, 4, True), (64, 256, 4, 4, True), (64, 512, 2, 8, True),
                                         (32, 256, 8, 4, True), (128, 256, 2, 8, True), (64, 256, 4, 4, False),
                                         (16, 512, 8, 4, True))]
    if m <= 128:
        return [TileConfig(block_m_for(m, 128), bn, bk, sk, w, st, True, True)
                for bn, bk, sk, w, st in ((64, 256, 2, 4, 4), (128, 128, 1, 4, 4), (128, 128, 2, 8, 4),
                                          (64, 256, 4, 4, 4), (128, 256, 1, 8, 4), (64, 128, 4, 4, 3),
                                          (64, 128, 2, 4, 3), (64, 128, 1, 4, 3))]
    bm = block_m_for(m, 64)
    return [TileConfig(bm2, bn, bk, 1, w, 3, True, True)
            for bm2 in sorted({bm, block_m_for(m, 128)})
            for bn, bk, w in ((128, 128, 4), (128, 128, 8), (256, 128, 8), (64, 128, 4))] + [TileConfig(64, 128, 128, 1, 4, 4)]


def few_a8_configs(m: int) -> list[TileConfig]:
    """Split/Bitwise variants do 2-4x the MMA work: profile a handful of tiles only."""
    c = a8_configs(m)
    return c[:3]


def w8_configs(m: int) -> list[TileConfig]:
    if m <= 16:
        return [TileConfig(16, bn, bk, sk, 4, 4) for bn, bk, sk in
                ((32, 256, 4), (64, 256, 4), (64, 128, 4), (32, 512, 8), (128, 128, 2))]
    return [TileConfig(block_m_for(m, bmcap), bn, bk, sk, w, 3) for bmcap, bn, bk, sk, w in
            ((64, 64, 128, 1, 4), (64, 128, 128, 2, 4), (128, 128, 64, 1, 8), (128, 256, 64, 1, 8))]


# --- runners ------------------------------------------------------------------------------------

def _run_w4a16(x2, store, act, cfg):
    from gearshift.kernels.w4a16 import w4a16_linear

    return w4a16_linear(x2, store, cfg)


def _run_w4a16_gemv(x2, store, act, cfg):
    from gearshift.kernels.w4a16 import w4a16_gemv

    return w4a16_gemv(x2, store, cfg)


def _run_w4a16_rowgemv(x2, store, act, cfg):
    from gearshift.kernels.w4a16_rowgemv import w4a16_rowgemv

    return w4a16_rowgemv(x2, store, cfg.bn, cfg.bk, cfg.warps, cfg.stages)


def rowgemv_configs(m: int) -> list[TileConfig]:
    """Single-token GEMV tiles (the sweep in benchmarks/rowgemv.py found BK 1024-2048 best)."""
    if m != 1:
        return []
    return [TileConfig(1, bn, bk, 1, w, st) for bn, bk, w, st in
            ((16, 1024, 4, 3), (8, 1024, 4, 3), (8, 2048, 4, 4), (16, 2048, 8, 3), (4, 1024, 4, 3), (16, 512, 4, 3))]


def rowgemv_config(n: int, k: int, group: int) -> TileConfig:
    """The measured-best tile family on the H100 at M = 1 (benchmarks/results/rowgemv_*.json)."""
    bk = 2048 if k >= 8192 and k % 2048 == 0 and (2048 % group == 0 or group % 2048 == 0) else 1024
    return TileConfig(1, 8 if n <= 4096 else 16, bk, 1, 4, 4 if bk == 2048 else 3)


def _sup_rowgemv(store, act, cfg):
    from gearshift.kernels.w4a16_rowgemv import rowgemv_supports

    return act is None and isinstance(store, Int4Weight) and cfg is not None and rowgemv_supports(store, cfg.bk)


def mma_configs(m: int) -> list[TileConfig]:
    """Register-fragment tensor-core tiles for 1..64 tokens (16 per program): rows per warp (bm
    8/16/32), K split, warps."""
    if m > 64:
        return []
    from gearshift.kernels.int4_mma_gemv import ksum_fits, xshare_fits

    tiles = [TileConfig(rows, 0, 128, sk, w, 1, prefetch=pf, kwarps=kw) for rows, sk, w, pf, kw in
            ((16, 1, 4, False, 1), (16, 2, 4, False, 1), (16, 4, 4, False, 1), (16, 8, 4, False, 1),
             (16, 16, 4, False, 1), (16, 2, 2, False, 1), (16, 8, 2, False, 1), (8, 4, 4, False, 1),
             (8, 8, 4, False, 1), (8, 8, 1, False, 1), (16, 2, 4, True, 1), (16, 4, 4, True, 1),
             # stop 13 sweep (int4_gemv_*_bulk.json): 14 slices for K = 14336, 2-block steps at split 8
             (16, 14, 4, False, 1), (16, 14, 2, False, 1), (16, 7, 2, True, 1), (16, 8, 4, True, 1),
             (16, 8, 2, True, 1), (16, 4, 2, True, 1), (16, 1, 2, True, 1),
             # stop 22: the K split inside the CTA (no global split-K tail)
             *K_WARP_TILES,
             # stop 23: 32 rows per warp (two A fragments per B fragment: half the activation loads)
             *ROWS32_TILES)] + [
             # stop 30: the warp's whole K slice loaded before the PDL wait (where it fits in registers)
             TileConfig(rows, 0, 128, sk, w, 1, kwarps=kw, preload=True) for rows, sk, w, kw in PRELOAD_TILES] + [
             # stop 33: two blocks per loop trip; register caps where 64 registers fit two more CTAs
             TileConfig(rows, 0, 128, sk, w, 1, kwarps=kw, pairs=True) for rows, sk, w, kw in PAIRED_TILES] + [
             TileConfig(rows, 0, 128, sk, w, 1, kwarps=kw, preload=pl, maxnreg=64) for rows, sk, w, kw, pl in CAPPED_TILES] + [
             # 32 rows per warp at 9..16 tokens: 130 registers instead of 128 cost 2-warp CTAs one CTA per SM
             TileConfig(32, 0, 128, sk, w, 1, prefetch=pf, kwarps=kw, maxnreg=128) for _, sk, w, pf, kw in ROWS32_TILES] + [
             # stop 41: each block's activations staged once per CTA in shared memory (5..16 tokens; stop 43: 2..16)
             x for x in (TileConfig(rows, 0, 128, sk, w, 1, kwarps=kw, maxnreg=r, pairs=lp == "T", preload=lp == "L",
                                    xshare=True) for rows, sk, w, kw, r, lp in XSHARE_TILES)
             if 1 < m <= 16 and xshare_fits(x, m)]
    # stop 42: each tile with K slices in the CTA and no split-K also with the shared-memory K sum
    return tiles + [k for k in (replace(c, ksum=True) for c in tiles) if ksum_fits(k, m)]


#: (rows per warp, split, warps, 2-block steps, warps per row group) of the in-CTA K split
K_WARP_TILES = ((16, 1, 2, False, 2), (16, 1, 4, False, 4), (16, 1, 8, False, 8), (16, 1, 8, False, 4),
                (16, 1, 16, False, 16), (16, 1, 16, False, 8), (16, 1, 4, True, 4), (16, 1, 8, True, 8),
                (16, 1, 8, True, 4), (16, 2, 8, False, 8), (16, 2, 4, False, 4), (16, 2, 8, True, 4),
                (8, 1, 8, False, 8), (8, 1, 4, False, 4), (16, 1, 16, True, 8), (16, 1, 16, True, 16))

#: (rows per warp, split, warps, warps per row group) of the preloading tiles (TileConfig.preload)
PRELOAD_TILES = ((16, 1, 2, 2), (16, 1, 4, 4), (16, 1, 8, 8), (16, 1, 8, 4), (16, 1, 16, 16), (16, 1, 16, 8),
                 (8, 1, 8, 8), (8, 1, 4, 4), (32, 1, 8, 8), (32, 1, 4, 4))

#: (rows per warp, split, warps, warps per row group) of the two-blocks-per-trip tiles (stop 33: the
#: one-token loop's 149 instructions per block -> 136; at 16 tokens the 32-row tiles gained up to 11%)
PAIRED_TILES = ((16, 1, 2, 2), (16, 1, 4, 4), (16, 1, 8, 4), (16, 1, 8, 8), (16, 1, 16, 8), (16, 2, 8, 8),
                (32, 1, 2, 2), (32, 1, 4, 4), (32, 1, 8, 8), (32, 1, 8, 4), (32, 1, 4, 2), (32, 8, 2, 1),
                (32, 2, 4, 1))
#: (..., preload) of the tiles also offered under a 64-register cap (`benchmarks/mma_ablations/lop3.py`:
#: 16-warp CTAs and the 8-row preload, whose uncapped counts lose a CTA per SM after stop 33's LOP3s)
CAPPED_TILES = ((16, 1, 16, 16, False), (16, 1, 16, 8, False), (16, 2, 8, 8, False), (8, 1, 8, 8, True),
                (8, 1, 4, 4, True), (16, 16, 4, 1, False), (16, 1, 2, 2, False))

#: the same for 32 rows per warp, with and without a K split over programs
ROWS32_TILES = ((32, 1, 2, False, 1), (32, 1, 4, False, 1), (32, 1, 2, False, 2), (32, 1, 4, False, 4),
                (32, 1, 4, False, 2), (32, 1, 8, False, 8), (32, 1, 8, False, 4), (32, 1, 8, False, 2),
                (32, 2, 4, False, 1), (32, 4, 4, False, 1), (32, 8, 2, False, 1), (32, 1, 4, True, 4),
                (32, 1, 8, True, 4), (32, 1, 2, True, 1), (32, 2, 4, True, 2))


#: (rows per warp, split, warps, warps per row group, register cap, loop: "" one block per trip, "T"
#: two (`pairs`), "L" `preload`) of the xshare tiles (TileConfig.xshare): the ones within 3.5% of the
#: best xshare tile at some Llama-3-8B shape at 8 or 16 tokens (`mma_ablations/xshare.py`, stop 41)
XSHARE_TILES = ((16, 1, 16, 8, 0, "T"), (16, 1, 8, 4, 0, "T"), (16, 1, 8, 4, 0, ""), (32, 1, 2, 1, 0, ""),
                (32, 1, 8, 2, 0, ""), (32, 1, 8, 4, 0, "T"), (16, 1, 4, 2, 0, ""), (32, 1, 8, 2, 128, ""),
                (32, 1, 4, 2, 0, "T"), (16, 1, 16, 8, 0, ""), (32, 1, 4, 2, 128, ""), (32, 1, 4, 2, 0, ""),
                (16, 1, 16, 4, 0, "T"), (16, 1, 16, 8, 0, "L"), (16, 1, 8, 4, 0, "L"),
                (32, 1, 2, 1, 0, "T"))  # (gate_up at 8 tokens: xshare_stop41_w2_*.json)


def _run_w4a16_mma(x2, store, act, cfg):
    from gearshift.kernels.int4_mma_gemv import mma_gemv

    return mma_gemv(x2, store, cfg)


def _run_w4a16_mma_glu(x2, store, cfg, x_tiles: int = 0, y_tiles: bool = False):
    from gearshift.kernels.int4_mma_gemv import mma_gemv, mma_glu_supports

    if not mma_glu_supports(store, cfg, x_tiles or x2.shape[0], x2.dtype) or (x_tiles and not tiles_serve(store, cfg)):
        return None
    return mma_gemv(x2, store, cfg, glu=True, x_tiles=x_tiles, y_tiles=y_tiles)


def tiles_serve(store, cfg) -> bool:
    """Whether a fragment tile reads inputs in `x_tiles`' layout: int4 weights, inputs from global memory (not
    xshare), in blocks of groups of a multiple of 128 columns."""
    return (isinstance(store, Int4Weight) and cfg is not None and not cfg.xshare and store.group_size % 128 == 0
            and store.in_features % 128 == 0)


def _run_w4a16_mma_tiles(data, m, store, cfg):
    from gearshift.kernels.int4_mma_gemv import mma_gemv

    return mma_gemv(data, store, cfg, x_tiles=m) if tiles_serve(store, cfg) else None


def _run_w4a8_mma_glu_codes(codes, store, cfg, out_dtype):
    from gearshift.kernels.int4_mma_gemv import mma_gemv, mma_glu_supports

    if not mma_glu_supports(store, cfg, codes.codes.shape[0], codes.codes.dtype, codes=True):
        return None
    return mma_gemv(codes.codes, store, cfg, token_scales=codes.scales, out_dtype=out_dtype, glu=True,
                    fragment_order=codes.fragment_order)


def _run_w4a8_mma(x2, store, act, cfg):
    from gearshift.kernels.int4_mma_gemv import mma_gemv_quantized

    return mma_gemv_quantized(x2, store, act, cfg)


def _run_w4a8_mma_codes(codes, store, cfg, out_dtype):
    from gearshift.kernels.int4_mma_gemv import mma_gemv

    return mma_gemv(codes.codes, store, cfg, token_scales=codes.scales, out_dtype=out_dtype,
                    fragment_order=codes.fragment_order)


def _run_w4a8_mma_int8(x2, store, act, cfg):
    from gearshift.kernels.int4_mma_gemv import mma_gemv_quantized

    return mma_gemv_quantized(x2, store, act, cfg, int8=True, fragment_order=s8_fragment_order_on())


def _sup_mma(quantized: bool, int8: bool = False):
    def sup(store, act, cfg):
        from gearshift.kernels.int4_mma_gemv import mma_gemv_supports

        if not isinstance(store, Int4Weight) or cfg is None or (act is None) == quantized:
            return False
        if act is not None and (not isinstance(act, ActQuantSpec) or act.group_size is not None):
            return False
        if int8 and (act.dtype == "fp8" or cfg.xshare):  # e4m3 codes are not integers; xshare tiles on int8
            return False  # codes were 1.0-1.23x the best tile at 8 / 16 tokens (stop 41), so not timed
        # (one token tile: the stricter xshare split of a block's rows over the CTA's row groups)
        return mma_gemv_supports(store, cfg, 1, torch.int8 if int8 else torch.bfloat16)

    return sup


def fma_gemv_configs(m: int) -> list[TileConfig]:
    """CUDA-core single-token GEMV (int4_gemv): the fallback when groups are not a multiple of 128."""
    if m != 1:
        return []
    return [TileConfig(1, bn, bk, sk, w, 2) for bn, bk, sk, w in
            ((32, 128, 4, 2), (32, 128, 8, 2), (16, 128, 4, 1), (32, 64, 4, 2), (32, 32, 4, 2), (64, 128, 2, 2))]


def _run_w4a16_fma(x2, store, act, cfg):
    from gearshift.kernels.int4_gemv import int4_gemv

    return int4_gemv(x2, store, cfg)


def _sup_fma(store, act, cfg):
    from gearshift.kernels.int4_gemv import int4_gemv_supports

    return act is None and isinstance(store, Int4Weight) and cfg is not None and int4_gemv_supports(store, cfg)


#: strategies that serve at most this many tokens per call (the dispatcher never sends more)
MAX_TOKENS = {"w4a16_mma": 64, "w4a8_mma": 64, "w4a8_mma_int8": 64, "w4a16_fma": 1, "w4a16_rowgemv": 1}


def gemv_configs(m: int) -> list[TileConfig]:
    """CUDA-core GEMV: only for M <= 4 (bm is the row cap)."""
    if m > 4:
        return []
    bm = 1 if m == 1 else (2 if m == 2 else 4)
    return [TileConfig(bm, bn, bk, sk, w, st) for bn, bk, sk, w, st in
            ((16, 512, 1, 4, 3), (32, 512, 1, 4, 3), (16, 256, 2, 4, 4), (32, 256, 4, 4, 4), (64, 256, 2, 8, 3),
             (8, 1024, 1, 4, 3), (32, 512, 2, 8, 3))]


def _sup_w4a16(store, act, cfg):
    from gearshift.kernels.w4a16 import supports

    return isinstance(store, Int4Weight) and act is None and supports(store, cfg)


def _sup_w4a16_gemv(store, act, cfg):
    return _sup_w4a16(store, act, cfg) and store.layout == ROWS


def _run_w4a16_wgmma(x2, store, act, cfg):
    from gearshift.kernels.w4a16_wgmma import w4a16_wgmma

    return w4a16_wgmma(x2, store, cfg)


def _wgmma_configs(m: int) -> list[TileConfig]:
    from gearshift.kernels.w4a16_wgmma import wgmma_configs

    return wgmma_configs(m)


def _sup_w4a16_wgmma(store, act, cfg):
    from gearshift.kernels.w4a16_wgmma import wgmma_supports

    return act is None and wgmma_supports(store, cfg)


def _per_token_codes(act) -> bool:
    """Activations the 16-bit wgmma kernels take as codes: quantized per token (their scales in
    the epilogue), not per group."""
    return isinstance(act, ActQuantSpec) and act.group_size is None


def _run_w4a8_wgmma(x2, store, act, cfg):
    from gearshift.kernels.w4a16_wgmma import w4a8_wgmma

    return w4a8_wgmma(x2, store, act, cfg)


def _sup_w4a8_wgmma(store, act, cfg):
    from gearshift.kernels.w4a16_wgmma import wgmma_supports

    return _per_token_codes(act) and wgmma_supports(store, cfg)


def _run_w4a16_wgmma_small(x2, store, act, cfg):
    from gearshift.kernels.w4a16_wgmma_small import w4a16_wgmma_small

    return w4a16_wgmma_small(x2, store, cfg)


def _run_w4a8_wgmma_small(x2, store, act, cfg):
    from gearshift.kernels.w4a16_wgmma_small import w4a8_wgmma_small

    return w4a8_wgmma_small(x2, store, act, cfg)


def _small_configs(m: int) -> list[TileConfig]:
    from gearshift.kernels.w4a16_wgmma_small import small_configs

    return small_configs(m)


def _sup_w4a16_wgmma_small(store, act, cfg):
    from gearshift.kernels.w4a16_wgmma_small import small_supports

    return act is None and small_supports(store, cfg)


def _sup_w4a8_wgmma_small(store, act, cfg):
    from gearshift.kernels.w4a16_wgmma_small import small_supports

    return _per_token_codes(act) and small_supports(store, cfg)


def _run_w4a8_int8_wgmma(x2, store, act, cfg):
    from gearshift.kernels.w4a8_wgmma import w4a8_int8_wgmma

    return w4a8_int8_wgmma(x2, store, act, cfg)


def _int8_wgmma_configs(m: int) -> list[TileConfig]:
    from gearshift.kernels.w4a8_wgmma import int8_wgmma_configs

    return int8_wgmma_configs(m)


def _sup_w4a8_int8_wgmma(store, act, cfg):
    from gearshift.kernels.w4a8_wgmma import int8_wgmma_supports

    return int8_wgmma_supports(store, act, cfg)


def _run_w4a8_progressive(x2, store, act, cfg):
    from gearshift.kernels.w4a8_progressive import w4a8_progressive

    return w4a8_progressive(x2, store, act, cfg)


def _run_progressive_codes(codes, store, cfg, out_dtype):
    from gearshift.kernels.w4a8_progressive import progressive_codes

    return progressive_codes(codes.codes, codes.scales, store, cfg, out_dtype)


def _progressive_configs(m: int) -> list[TileConfig]:
    from gearshift.kernels.w4a8_progressive import progressive_configs

    return progressive_configs(m)


def _sup_w4a8_progressive(store, act, cfg):
    from gearshift.kernels.w4a8_progressive import progressive_supports

    return progressive_supports(store, act, cfg)


def _w4a8_runner(w_parts: int, a_parts: int):
    def run(x2, store, act, cfg):
        from gearshift.kernels.w4a8 import w4a8_linear

        return w4a8_linear(x2, store, act, cfg, w_parts=w_parts, a_parts=a_parts)

    return run


def _sup_w4a8(fp8: bool):
    def sup(store, act, cfg):
        from gearshift.kernels.w4a8 import supports

        return (isinstance(store, Int4Weight) and act is not None and (act.dtype == "fp8") == fp8
                and supports(store, act, cfg))

    return sup


def _run_w8(x2, store, act, cfg):
    from gearshift.kernels.w8 import w8_linear

    return w8_linear(x2, store, act, cfg)


def _sup_w8(store, act, cfg):
    from gearshift.kernels.w8 import supports

    return isinstance(store, Int8Weight) and supports(store, act, cfg)


def _run_dequant_cublas(x2, store, act, cfg):
    from gearshift.kernels.library import dequant_cublas_linear

    return dequant_cublas_linear(x2, store, act)


def _run_cublas_dense(x2, store, act, cfg):
    return F.linear(x2, store.weight.to(x2.dtype))


def _run_reference(x2, store, act, cfg):
    return linear_reference(x2, store, act)


_INT4_MODES = ("w4a16", "w4a8", "w4a8fp8", "w4a4")
_INT8_MODES = ("w8a16", "w8a8", "w8a4")

register(Strategy("w4a16_tc", DPRPartition((4,), (16,), "bf16", "padding"), ("w4a16",), _run_w4a16,
                  a16_configs, _sup_w4a16))
register(Strategy("w4a16_wgmma", DPRPartition((4,), (16,), "bf16-wgmma", "padding"), ("w4a16",), _run_w4a16_wgmma,
                  _wgmma_configs, _sup_w4a16_wgmma))
register(Strategy("w4a8_wgmma", DPRPartition((4,), (8,), "bf16-wgmma", "padding"), ("w4a8", "w4a4", "w4a8fp8"),
                  _run_w4a8_wgmma, _wgmma_configs, _sup_w4a8_wgmma))
register(Strategy("w4a16_wgmma_small", DPRPartition((4,), (16,), "bf16-wgmma", "padding"), ("w4a16",),
                  _run_w4a16_wgmma_small, _small_configs, _sup_w4a16_wgmma_small))
register(Strategy("w4a8_wgmma_small", DPRPartition((4,), (8,), "bf16-wgmma", "padding"), ("w4a8", "w4a4", "w4a8fp8"),
                  _run_w4a8_wgmma_small, _small_configs, _sup_w4a8_wgmma_small))
register(Strategy("w4a8_int8_wgmma", DPRPartition((4,), (8,), "int8-wgmma", "padding"), ("w4a8", "w4a4"),
                  _run_w4a8_int8_wgmma, _int8_wgmma_configs, _sup_w4a8_int8_wgmma))
register(Strategy("w4a8_progressive", DPRPartition((4,), (8,), "int8-wgmma", "padding"), ("w4a8", "w4a4"),
                  _run_w4a8_progressive, _progressive_configs, _sup_w4a8_progressive,
                  run_codes=_run_progressive_codes))
register(Strategy("w4a16_gemv", DPRPartition((4,), (16,), "fp32-fma", "padding"), ("w4a16",), _run_w4a16_gemv,
                  gemv_configs, _sup_w4a16_gemv))
register(Strategy("w4a16_rowgemv", DPRPartition((4,), (16,), "fp32-fma", "padding"), ("w4a16",),
                  _run_w4a16_rowgemv, rowgemv_configs, _sup_rowgemv))
register(Strategy("w4a16_mma", DPRPartition((4,), (16,), "bf16-mma.sync", "padding"), ("w4a16",),
                  _run_w4a16_mma, mma_configs, _sup_mma(False), run_glu=_run_w4a16_mma_glu,
                  run_tiles=_run_w4a16_mma_tiles))
register(Strategy("w4a16_fma", DPRPartition((4,), (16,), "fp32-fma", "padding"), ("w4a16",), _run_w4a16_fma,
                  fma_gemv_configs, _sup_fma))
register(Strategy("w4a8_mma", DPRPartition((4,), (8,), "bf16-mma.sync", "padding"), ("w4a8", "w4a4", "w4a8fp8"),
                  _run_w4a8_mma, mma_configs, _sup_mma(True), run_codes=_run_w4a8_mma_codes, codes_float=True,
                  run_glu_codes=_run_w4a8_mma_glu_codes))
register(Strategy("w4a8_mma_int8", DPRPartition((4,), (8,), "int8-mma.sync", "padding"), ("w4a8", "w4a4"),
                  _run_w4a8_mma_int8, mma_configs, _sup_mma(True, int8=True), run_codes=_run_w4a8_mma_codes,
                  run_glu_codes=_run_w4a8_mma_glu_codes, codes_fragment_order=True))
register(Strategy("w4a8_pad", DPRPartition((4,), (8,), "int8", "padding"), ("w4a8", "w4a4"),
                  _w4a8_runner(1, 1), a8_configs, _sup_w4a8(False)))
register(Strategy("w4a8_split", DPRPartition((4,), (4, 4), "int8", "split"), ("w4a8",),
                  _w4a8_runner(1, 2), few_a8_configs, _sup_w4a8(False)))
register(Strategy("w4a8_bit2", DPRPartition((2, 2), (8,), "int8", "bitwise"), ("w4a8", "w4a4"),
                  _w4a8_runner(2, 1), few_a8_configs, _sup_w4a8(False)))
register(Strategy("w4a8_bitwise", DPRPartition((1, 1, 1, 1), (8,), "int8", "bitwise"), ("w4a8", "w4a4"),
                  _w4a8_runner(4, 1), few_a8_configs, _sup_w4a8(False)))
register(Strategy("w4a8_fp8", DPRPartition((4,), (8,), "fp8", "padding"), ("w4a8fp8",),
                  _w4a8_runner(1, 1), a8_configs, _sup_w4a8(True)))
register(Strategy("w8a16_tc", DPRPartition((8,), (16,), "bf16", "padding"), ("w8a16",), _run_w8,
                  w8_configs, lambda s, a, c: a is None and _sup_w8(s, a, c)))
register(Strategy("w8a8_tc", DPRPartition((8,), (8,), "int8", "padding"), ("w8a8", "w8a4"), _run_w8,
                  w8_configs, lambda s, a, c: a is not None and _sup_w8(s, a, c)))
register(Strategy("dequant_cublas", DPRPartition((4,), (16,), "bf16", "library"), _INT4_MODES + _INT8_MODES,
                  _run_dequant_cublas, supports=lambda s, a, c: isinstance(s, (Int4Weight, Int8Weight))))
register(Strategy("cublas", DPRPartition((16,), (16,), "bf16", "library"), ("w16a16",), _run_cublas_dense,
                  supports=lambda s, a, c: isinstance(s, DenseWeight) and a is None))
register(Strategy("reference", DPRPartition((), (), "any", "library"), (), _run_reference, gpu_only=False))

#: ADAngel-R (the paper's static rule, section 6): M <= 8 Bitwise, 8 < M <= 64 Split, else Padding,
#: mapped per mode onto the strategies that exist for it (first available wins).
RULE_FAMILIES = {"bitwise": 8, "split": 64, "padding": 1 << 62}
RULE_NAMES = {
    "w4a8": {"bitwise": ["w4a8_bitwise"], "split": ["w4a8_split"], "padding": ["w4a8_pad"]},
    "w4a4": {"bitwise": ["w4a8_bitwise"], "split": ["w4a8_bit2"], "padding": ["w4a8_pad"]},
    "w4a16": {"bitwise": ["w4a16_gemv", "w4a16_tc"], "split": ["w4a16_tc"], "padding": ["dequant_cublas"]},
}


def rule_strategies(mode: str, m: int) -> list[str]:
    """The strategies ADAngel-R allows at this M (a family may map to several of ours)."""
    names = RULE_NAMES.get(mode)
    if names is None:
        return []
    for fam, hi in RULE_FAMILIES.items():
        if m <= hi:
            return list(names[fam])
    return []


def rule_strategy(mode: str, m: int) -> str | None:
    r = rule_strategies(mode, m)
    return r[0] if r else None
