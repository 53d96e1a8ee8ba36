"""W4A16 for few tokens (M <= 32) on Hopper: the warp-specialized TMA pipeline of the wgmma kernels
with a per-group scale-after, so the weights need no per-weight multiply.

Why: at 1..16 tokens a linear reads its weights once and the kernel's job is to keep the memory
system busy. The register-prefetch fragment kernel (`int4_mma_gemv.py`) leaves each warp waiting
on its own loads (docs/kernels_history.md, stop 13: 51% of DRAM throughput on gate_up at M = 1), and the
scale-before dequantization of `w4a16_wgmma` costs about 3.5 ALU operations per weight, which
does not amortize over few tokens. Here a TMA load warp keeps STAGES tiles in flight per CTA and
the consumers only widen each byte into two 16-bit numbers 128 + q (one IMAD and one LOP3 per
byte: the nibble becomes the low mantissa bits of 128.0), so per K tile (= one group)

    part[n, t] = sum_k (128 + q[n, k]) x[t, k]        (wgmma, fp32)
    xsum[t]    = sum_k x[t, k]                         (a second wgmma with A = 1.0)
    y[n, t]   += s[n, g] * part + (min[n, g] - 128 s[n, g]) * xsum

two FMAs per output element per group. The tokens are the wgmma's N (8, 16 or 32; rows past M
are TMA zero fill). DPR: P_W = (4), P_X = (16), padding on the bf16/fp16 MMA, reconstruct per
group in fp32, as `w4a16_mma` at M <= 16 on mma.sync. With `token_scales` the activations are
integer / fp8 codes (`w4a8_wgmma_small`: P_X = (8) padded to 16 bits).

Measured on the H100 (docs/kernels_history.md, stop 17): the map picks it at 16 and 32 tokens (whole step
2.65 vs 3.15 ms at M = 16); at 1..8 tokens it trails the fragment kernel (gate_up at M = 1: 36 vs
29 us). Its TMA stream alone reaches 24 us there; the widening and the two chains of eight
m64n8k16 wgmmas, each group retired before the next, take the rest.

The [BN, 8] scale / min boxes are `w4a8_wgmma`'s. CPU: Gluon has no interpreter,
so the tests compile for sm_90 and check `w4a16_wgmma_small_emulate`, the torch model of the
numerics, against the reference; the GPU tests compare the kernel with the model.
"""

from __future__ import annotations

import torch

from gearshift.kernels import w4a16_wgmma as W16  # (its store switch, read at launch)
from gearshift.kernels.config import TileConfig
from gearshift.kernels.splitk import splitk_buffers
from gearshift.kernels.w4a16_wgmma import HAS_GLUON, TWO_CONSUMER_REGS, _is_sm90_or_cpu, _weight_descriptor
from gearshift.quant.int4 import BLOCKS16, Int4Weight

#: 128 + q read from a 16-bit float whose low mantissa bits are the nibble q
OFFSET = 128.0
#: tokens per CTA (the wgmma's N)
BMS = (8, 16, 32)

if HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from gearshift.kernels.w4a8_wgmma import group_cols_layout, group_descriptors, pick_column
    from gearshift.kernels.w4a16_wgmma import _store_tile, _tma_load, act_layout, byte_layout, ring_barriers, tma_tiles

    _OFFSET = gl.constexpr(OFFSET)

    # byte b -> {128 + (b & 15), 128 + (b >> 4)} as a bf16 pair: b * 0x1001 puts the high nibble at
    # bits 16..19 and keeps the low one at 0..3; one LOP3 masks both and ORs in 128.0 (0x4300)
    _WIDEN_BF16 = gl.constexpr("{ .reg .b32 t; mul.lo.u32 t, $2, 0x1001; "
                               "lop3.b32 t, t, 0x000F000F, 0x43004300, 0xEA; mov.b32 {$0, $1}, t; }")
    # fp16: 128.0 is 0x5800 and its last mantissa bit is 1/8, so the nibbles go to bits 3..6 / 19..22
    _WIDEN_F16 = gl.constexpr("{ .reg .b32 t; mul.lo.u32 t, $2, 0x8008; "
                              "lop3.b32 t, t, 0x00780078, 0x58005800, 0xEA; mov.b32 {$0, $1}, t; }")

    @gluon.jit
    def widen_bytes(b, F16: gl.constexpr):
        """Code byte (int32, 0..255) -> its two weights' 128 + q, low nibble first, exact."""
        if F16:
            lo, hi = gl.inline_asm_elementwise(_WIDEN_F16, "=h,=h,r", [b], dtype=(gl.float16, gl.float16),
                                               is_pure=True, pack=1)
        else:
            lo, hi = gl.inline_asm_elementwise(_WIDEN_BF16, "=h,=h,r", [b], dtype=(gl.bfloat16, gl.bfloat16),
                                               is_pure=True, pack=1)
        return lo, hi

    @gluon.jit
    def new_scale_block(i, t0):
        """Whether K tile i of this slice starts a block of 8 groups (or the slice)."""
        return (i == 0) | ((t0 + i) % 8 == 0)

    @gluon.jit
    def _load_partition_blocks(x_desc, w_desc, sc_desc, mn_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty,
                               s_ready, s_empty, m0, n0, t0, num_k, GPS: gl.constexpr, BLOCKS: gl.constexpr,
                               ABLATE: gl.constexpr):
        """One warp, TMA only: per stage the activations and the weight bytes of GPS groups into the
        STAGES ring; the scales and mins of groups 8 (g / 8) .. + 7 of the BN rows once per block
        of 8 groups, into a ring of two (a [BN, 8] box per group was 8 times the scale traffic;
        measured, the two forms ran alike). ABLATE bit 4 (timing only): no activation tiles."""
        STAGES: gl.constexpr = ready.type.shape[0]
        G: gl.constexpr = x_desc.block_type.shape[1]
        XB: gl.constexpr = x_desc.block_type.nbytes * (1 - (ABLATE // 4) % 2)  # ABLATE bit 4: no activations
        NB: gl.constexpr = GPS * (XB + w_desc.block_type.nbytes)
        blk = 0
        for i in range(num_k // GPS):
            s = i % STAGES
            for u in gl.static_range(GPS):
                if new_scale_block(i * GPS + u, t0):
                    ss = blk % 2
                    g8 = (t0 + i * GPS + u) // 8 * 8
                    mbarrier.wait(s_empty.index(ss), ((blk // 2) & 1) ^ 1)
                    mbarrier.expect(s_ready.index(ss), 2 * sc_desc.block_type.nbytes)
                    _tma_load(sc_desc, [n0, g8], s_ready.index(ss), sc_bufs.index(ss))
                    _tma_load(mn_desc, [n0, g8], s_ready.index(ss), mn_bufs.index(ss))
                    blk += 1
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), NB)
            for u in gl.static_range(GPS):
                tma_tiles(x_desc, w_desc, x_bufs.index(s * GPS + u), w_bufs.index(s * GPS + u), ready.index(s),
                          m0, n0, (t0 + i * GPS + u) * G, BLOCKS, (ABLATE & 4) == 0)

    @gluon.jit
    def _sa_mma_partition(x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, s_ready, s_empty, y_ptr, ws_ptr, cnt_ptr,
                          xs_ptr, m0, n0, M, N, t0, num_k, ROW0: gl.constexpr, BN: gl.constexpr, NPART: gl.constexpr,
                          F16: gl.constexpr, SPLIT_K: gl.constexpr, TOKEN_SCALES: gl.constexpr, WARPS: gl.constexpr,
                          ABLATE: gl.constexpr, VEC: gl.constexpr):
        """Weight rows [ROW0, ROW0 + BN) of the tile. Everything a tile needs from shared memory is
        read before its wgmmas and the slot goes back right after them (each mbarrier arrive and
        the first shared read after one cost a warpgroup barrier; w4a8_wgmma, stop 16)."""
        STAGES: gl.constexpr = ready.type.shape[0]
        GPS: gl.constexpr = x_bufs.type.shape[0] // STAGES  # groups per stage
        BM: gl.constexpr = x_bufs.type.shape[1]
        BKX: gl.constexpr = x_bufs.type.shape[2]
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, BM, 16])
        dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        bl: gl.constexpr = byte_layout(BN, BKX // 2, WARPS)
        rows: gl.constexpr = gl.SliceLayout(1, mma)
        gcl: gl.constexpr = group_cols_layout(BN, WARPS)
        ones = gl.full([BN, BKX], 1.0, x_bufs.dtype, layout=dot)
        acc = gl.zeros([BN, BM], gl.float32, layout=mma)
        part = gl.zeros([BN, BM], gl.float32, layout=mma)  # each group overwrites both (use_acc=False)
        xsum = gl.zeros([BN, BM], gl.float32, layout=mma)
        sc8 = gl.zeros([BN, 8], gl.float16, layout=gcl)  # the scales / mins of the current 8 groups
        mn8 = gl.zeros([BN, 8], gl.float16, layout=gcl)
        blk = 0
        for i in range(num_k // GPS):
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            for u in gl.static_range(GPS):
                gi = i * GPS + u
                if new_scale_block(gi, t0):  # into registers, and the slot goes straight back
                    ss = blk % 2
                    mbarrier.wait(s_ready.index(ss), (blk // 2) & 1)
                    sc8 = sc_bufs.index(ss).slice(ROW0, BN).load(gcl)
                    mn8 = mn_bufs.index(ss).slice(ROW0, BN).load(gcl)
                    mbarrier.arrive(s_empty.index(ss))
                    blk += 1
                if (ABLATE & 1) == 0:  # ABLATE bit 1 (timing only): the consumer just hands the slot back
                    j = (t0 + gi) % 8  # the group among the 8 of the block
                    sc = pick_column(sc8, j, rows)
                    mn = pick_column(mn8, j, rows)
                    w_s = w_bufs.index(s * GPS + u).reshape([BN * NPART, BKX // 2]).slice(ROW0, BN)
                    x_s = x_bufs.index(s * GPS + u)
                    if ABLATE & 2:  # timing experiments only: no widening, no wgmma
                        part = part + gl.convert_layout(gl.sum(w_s.load(bl), 1).to(gl.float32), rows)[:, None]
                    else:
                        b = w_s.load(bl).to(gl.int32)
                        lo, hi = widen_bytes(b, F16)
                        a = gl.convert_layout(gl.reshape(gl.join(lo, hi), [BN, BKX]), dot, assert_trivial=True)
                        xt = x_s.permute((1, 0))
                        part = warpgroup_mma(a, xt, part, use_acc=False, is_async=True)
                        xsum = warpgroup_mma(ones, xt, xsum, use_acc=False, is_async=True)
                        # retire before the next group's A registers are built (w4a16_wgmma's register-A note)
                        part, xsum = warpgroup_mma_wait(0, deps=(part, xsum))
                    acc = gl.fma(part, sc[:, None], acc)
                    acc = gl.fma(xsum, (mn - _OFFSET * sc)[:, None], acc)
            mbarrier.arrive(empty.index(s))
        _store_tile(acc, mma, y_ptr, ws_ptr, cnt_ptr, xs_ptr, m0, n0 + ROW0, M, N, ROW0 // BN, NPART, SPLIT_K,
                    TOKEN_SCALES, WARPS, VEC)

    @gluon.jit
    def w4a16_wgmma_small_kernel(x_desc, w_desc, sc_desc, mn_desc, xs_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K,
                                 G: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, BLOCKS: gl.constexpr,
                                 F16: gl.constexpr, SPLIT_K: gl.constexpr, CONSUMERS: gl.constexpr,
                                 TOKEN_SCALES: gl.constexpr, GPS: gl.constexpr, CREGS: gl.constexpr,
                                 LREGS: gl.constexpr, num_warps: gl.constexpr, ABLATE: gl.constexpr = 0,
                                 VEC_STORE: gl.constexpr = False):
        BM: gl.constexpr = x_desc.block_type.shape[0]
        BKX: gl.constexpr = x_desc.block_type.shape[1]
        gl.static_assert(BKX == G, "one K tile per quantization group")
        m0 = gl.program_id(1) * BM
        n0 = gl.program_id(0) * BN
        x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES * GPS] + x_desc.block_type.shape, x_desc.layout)
        w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES * GPS] + w_desc.block_type.shape, w_desc.layout)
        sc_bufs = gl.allocate_shared_memory(gl.float16, [2, BN, 8], sc_desc.layout)
        mn_bufs = gl.allocate_shared_memory(gl.float16, [2, BN, 8], mn_desc.layout)
        ready, empty = ring_barriers(STAGES, 1, CONSUMERS)  # ready: the TMA bytes
        s_ready, s_empty = ring_barriers(2, 1, CONSUMERS)  # the scale / min boxes
        num_k = (K // BKX) // SPLIT_K  # groups per slice (a multiple of GPS: small_supports)
        t0 = gl.program_id(2) * num_k
        if CONSUMERS == 1:
            gl.warp_specialize([
                (_sa_mma_partition, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, s_ready, s_empty, y_ptr, ws_ptr,
                                     cnt_ptr,
                                     xs_ptr, m0, n0, M, N, t0, num_k, 0, BN, 1, F16, SPLIT_K, TOKEN_SCALES,
                                     num_warps, ABLATE, VEC_STORE)),
                (_load_partition_blocks, (x_desc, w_desc, sc_desc, mn_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, ready,
                                          empty, s_ready, s_empty, m0, n0, t0, num_k, GPS, BLOCKS, ABLATE)),
            ], [1], [LREGS])
        else:  # two independent 4-warp consumers on the two row halves
            half: gl.constexpr = BN // 2
            gl.warp_specialize([
                (_sa_mma_partition, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, s_ready, s_empty, y_ptr, ws_ptr,
                                     cnt_ptr,
                                     xs_ptr, m0, n0, M, N, t0, num_k, 0, half, 2, F16, SPLIT_K, TOKEN_SCALES,
                                     num_warps, ABLATE, VEC_STORE)),
                (_sa_mma_partition, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, s_ready, s_empty, y_ptr, ws_ptr,
                                     cnt_ptr,
                                     xs_ptr, m0, n0, M, N, t0, num_k, half, half, 2, F16, SPLIT_K, TOKEN_SCALES,
                                     num_warps, ABLATE, VEC_STORE)),
                (_load_partition_blocks, (x_desc, w_desc, sc_desc, mn_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, ready,
                                          empty, s_ready, s_empty, m0, n0, t0, num_k, GPS, BLOCKS, ABLATE)),
            ], [num_warps, 1], [CREGS, LREGS])

    def _act_descriptor(x2: torch.Tensor, bm: int, bk: int):
        xdt = gl.float16 if x2.dtype == torch.float16 else gl.bfloat16
        return TensorDescriptor.from_tensor(x2, [bm, bk], act_layout(bm, bk, xdt))


#: (BM tokens, BN weight rows, warps, stages, register cap, split-K, groups per stage). A stage
#: holds `groups` K tiles of one group each (cfg.bk = groups * G): each stage costs the consumers
#: two warpgroup barriers (its mbarrier wait and arrive), which more groups per stage amortize.
#: Few tokens leave most of the registers free, so a cap fits several CTAs per SM (a one-consumer
#: CTA is two warpgroups: the load warp's is padded); split-K fills the SMs where N / BN tiles are
#: few (N = 4096: 64 tiles of 64 rows for 132 SMs).
_CONFIGS = ((8, 64, 4, 4, 96, 1, 1), (8, 64, 4, 4, 64, 1, 2), (8, 64, 4, 4, 80, 1, 2), (8, 64, 4, 2, 64, 1, 4),
            (8, 64, 4, 4, 96, 2, 2), (8, 64, 4, 4, 96, 4, 1), (8, 64, 4, 3, 64, 4, 2), (8, 64, 4, 2, 80, 8, 2),
            (8, 128, 8, 4, 0, 1, 1), (8, 128, 8, 3, 80, 1, 2), (8, 128, 8, 4, 0, 4, 1),
            (16, 64, 4, 4, 96, 1, 1), (16, 64, 4, 4, 80, 1, 2), (16, 64, 4, 4, 96, 2, 1), (16, 64, 4, 4, 96, 4, 1),
            (16, 64, 4, 3, 80, 4, 2), (16, 128, 8, 4, 0, 1, 1), (16, 128, 8, 4, 0, 4, 1),
            (32, 64, 4, 6, 128, 1, 1), (32, 64, 4, 4, 128, 2, 1), (32, 64, 4, 4, 128, 4, 1), (32, 128, 8, 4, 0, 1, 1),
            (32, 128, 8, 4, 0, 2, 1), (32, 64, 4, 3, 128, 1, 2))
#: registers of the load warp (setmaxnreg); two consumers share the rest of three warpgroups
LOAD_REGS = 40


def small_configs(m: int, group: int = 128) -> list[TileConfig]:
    """The tiles worth profiling at this M: those of the smallest token tile that covers it."""
    if m > max(BMS):
        return []
    bm = next(b for b in BMS if b >= m)
    return [TileConfig(b, bn, group * gps, sk, w, st, maxnreg=r) for b, bn, w, st, r, sk, gps in _CONFIGS if b == bm]


def smem_bytes(cfg: TileConfig, x_bytes: int = 2) -> int:
    return cfg.stages * (cfg.bm * cfg.bk * x_bytes + cfg.bn * cfg.bk // 2) + 64 * cfg.bn + 1024


def small_supports(store, cfg: TileConfig | None, x_dtype: torch.dtype | None = None) -> bool:
    if not HAS_GLUON or not isinstance(store, Int4Weight) or cfg is None:
        return False
    n, k, g = store.out_features, store.in_features, store.group_size
    if g != 128 or cfg.bk % g or cfg.bk // g not in (1, 2, 4) or cfg.bm not in BMS or cfg.a_smem:
        return False
    if cfg.warps not in (4, 8) or cfg.bn != 16 * cfg.warps or smem_bytes(cfg) > 227 * 1024:
        return False
    if n % cfg.bn or k % g or (k // g) % 8 or store.scales.dtype != torch.float16:
        return False
    if cfg.split_k not in (1, 2, 4, 8) or (k // g) % (cfg.split_k * (cfg.bk // g)):  # whole stages per slice
        return False
    if x_dtype is not None and x_dtype not in (torch.bfloat16, torch.float16):
        return False
    return _is_sm90_or_cpu()


def consumer_regs(cfg: TileConfig) -> tuple[int, int, int]:
    """(launch register cap, second consumer's setmaxnreg, load warp's): the two-consumer CTA is
    three warpgroups sharing 3 * cap registers per lane."""
    if cfg.warps == 8:
        cap = cfg.maxnreg or TWO_CONSUMER_REGS
        return cap, (3 * cap - LOAD_REGS) // 2 // 8 * 8, LOAD_REGS
    return cfg.maxnreg, 0, LOAD_REGS


def w4a16_wgmma_small(x2: torch.Tensor, store: Int4Weight, cfg: TileConfig,
                      token_scales: torch.Tensor | None = None, ablate: int = 0) -> torch.Tensor:
    """x2 [M, K] bf16/fp16 -> [M, N] in x2's dtype, on an sm_90 GPU. With `token_scales` [M]
    (fp32), x2 holds activation codes and row m of the result is multiplied by token_scales[m].
    `ablate` != 0 only for timing experiments (wrong results): bit 1 the consumer only waits and
    hands slots back, bit 2 no widening and no wgmma, bit 4 no activation tiles."""
    if not small_supports(store, cfg, x2.dtype):
        raise ValueError(f"w4a16_wgmma_small cannot run {cfg} on this store/device "
                         f"({store.out_features}x{store.in_features}, group {getattr(store, 'group_size', '?')}, "
                         f"x {x2.dtype}); small_supports() says which")
    if x2.stride(1) != 1 or (x2.stride(0) * x2.element_size()) % 16 or x2.data_ptr() % 16:
        x2 = x2.contiguous()
    m, n, k, g = x2.shape[0], store.out_features, store.in_features, store.group_size
    y = torch.empty((m, n), device=x2.device, dtype=x2.dtype)
    x_desc = _act_descriptor(x2, cfg.bm, g)
    w_desc = _weight_descriptor(store, cfg.bn, g)
    sc_desc, mn_desc = group_descriptors(store, cfg.bn)
    consumers = 2 if cfg.warps == 8 else 1
    grid = (n // cfg.bn, -(-m // cfg.bm), cfg.split_k)
    ws, cnt = splitk_buffers(y, cfg.split_k, m * n, grid[0] * grid[1] * consumers)
    cap, cregs, lregs = consumer_regs(cfg)
    xs = y if token_scales is None else token_scales
    w4a16_wgmma_small_kernel[grid](x_desc, w_desc, sc_desc, mn_desc, xs, y, ws, cnt, m, n, k, G=g, BN=cfg.bn,
                                   STAGES=cfg.stages, BLOCKS=store.layout == BLOCKS16, F16=x2.dtype == torch.float16,
                                   SPLIT_K=cfg.split_k, CONSUMERS=consumers, TOKEN_SCALES=token_scales is not None,
                                   GPS=cfg.bk // g, CREGS=cregs, LREGS=lregs, num_warps=cfg.warps // consumers,
                                   ABLATE=ablate, VEC_STORE=W16.WGMMA_VEC_STORE,
                                   **({"maxnreg": cap} if cap else {}))
    return y


def w4a8_wgmma_small(x2: torch.Tensor, store: Int4Weight, act, cfg: TileConfig) -> torch.Tensor:
    """W4A8 / W4A4 / W4A8-fp8 for few tokens: the activations quantized per token, their codes
    stored as exact 16-bit floats, and the same kernel scaling each token's output by its scale."""
    from gearshift.kernels.act_quant import quantize_act_triton

    codes, scales = quantize_act_triton(x2, act, codes_dtype=x2.dtype)
    return w4a16_wgmma_small(codes, store, cfg, token_scales=scales)


def w4a16_wgmma_small_emulate(x2: torch.Tensor, store: Int4Weight,
                              token_scales: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel's numerics in torch (fp64 stands in for the wgmma's fp32 accumulation): per group
    part = x . (128 + q), xsum = sum x, then in fp32 acc = fma(part, s, acc), acc = fma(xsum,
    min - 128 s, acc); the token scales and one rounding to x's dtype at the end."""
    g = store.group_size
    q = store.unpacked().to(torch.float64) + OFFSET  # [N, K]
    x = x2.to(torch.float64)
    acc = torch.zeros((store.out_features, x.shape[0]), dtype=torch.float32, device=x.device)
    for j in range(store.in_features // g):
        cols = slice(j * g, (j + 1) * g)
        part = (q[:, cols] @ x[:, cols].t()).float()
        xsum = x[:, cols].sum(1).float()[None, :]
        s = store.scales[:, j].float()[:, None]
        c = store.mins[:, j].float()[:, None] - OFFSET * s
        acc = (part.double() * s.double() + acc.double()).float()
        acc = (xsum.double() * c.double() + acc.double()).float()
    if token_scales is not None:
        acc = acc * token_scales.float().reshape(1, -1)
    return acc.t().to(x2.dtype)
