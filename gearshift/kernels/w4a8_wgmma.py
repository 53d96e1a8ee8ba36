"""W4A8 / W4A4 for large M on Hopper with int8 tensor cores: the Gluon kernel of `w4a16_wgmma`
with an int8 wgmma and a per-group fp32 scale-after.

Why: `w4a8_wgmma` runs the activation codes through the 16-bit MMA, so W4A8 there is never faster
than W4A16. The int8 MMA has twice the bf16 rate and needs no per-weight dequantization: a byte's
two nibbles *are* two int8 operands (0..15). Measured (docs/kernels_history.md, stop 16): the per-group
scale-after below costs 4 ALU operations per output element per group, more than the bf16 kernel's
dequantization once that is shared by 128+ tokens, so the map picks this kernel for few shapes.

DPR: P_W = (4) padded to 8 bits, P_X = (8) (int8 codes; W4A4's int4 codes are int8 too), int32
partial products, reconstruct in fp32 per group. One K tile is one quantization group (BK = G), so
the int32 result of a tile is exact and

    y[n, t] += s[n, g] * sum_k q[n, k] c[t, k] + min[n, g] * sum_k c[t, k]

with the code sums per (group, token) from the activation quantizer (`quantize_act_triton(...,
group_sums=G, sums_by_group=True)`) and the token scale applied in the epilogue. The int32 -> fp32 conversion avoids
I2F (16 per clock per SM on Hopper): |partial| < 2^22, so its bits plus those of 1.5 * 2^23 read
as 1.5 * 2^23 + partial, and one FMA with s and the exact constant -1.5 * 2^23 * s gives
round(partial * s).

Partitions as in `w4a16_wgmma`: a load warp (here TMA only: codes, weight bytes, [BN, 8] boxes of
scales and mins, a [1, BM] box of code sums) and one or two 4-warp consumers with A in registers,
each wgmma retired before the next tile's operands are built. CPU: `w4a8_int8_wgmma_emulate` is the
torch model of the numerics; Gluon has no interpreter, so the tests compile for sm_90 there.
"""

from __future__ import annotations

import torch

from gearshift.kernels import w4a16_wgmma as W16  # (its store switch, read at launch)
from gearshift.kernels.act_quant import fused_group_sums, quantize_act_triton
from gearshift.kernels.config import TileConfig
from gearshift.kernels.splitk import splitk_buffers
from gearshift.kernels.w4a16_wgmma import (HAS_GLUON, TWO_CONSUMER_REGS, _is_sm90_or_cpu, _weight_descriptor,
                                           store_descriptors)
from gearshift.quant.int4 import BLOCKS16, Int4Weight

#: the int8 codes of these activation formats run on the int8 MMA
INT8_CODES = ("int8", "int4")
#: 1.5 * 2^23: an int32 |v| < 2^22 added to its bit pattern reads as MAGIC + v in fp32
MAGIC = 12582912.0
MAGIC_BITS = 0x4B400000

if HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from gearshift.kernels.w4a16_wgmma import (_store_tile, _tma_load, act_layout, fragment_rows, grid_wait, k_slice,
                                               launch_dependents, ring_barriers, stream_k_segment, stream_k_tile,
                                               tma_tiles)

    _MAGIC = gl.constexpr(MAGIC)
    _MAGIC_BITS = gl.constexpr(MAGIC_BITS)

    @gluon.constexpr_function
    def byte_layout_i8(BN, BKH, warps):
        """Register layout of the uint8 tile [BN, BK/2] whose nibble split is the int8 wgmma A
        fragment (k_width 4): lane (g, t) of a warp holds rows g and g+8 and bytes 2t, 2t+1 (weights
        4t..4t+3, one 32-bit register after the split), then the same 16 weights further (+8 bytes)
        and each further 32-weight step; warps stack 16-row groups; extra rows repeat in registers."""
        extra, warp_bases = fragment_rows(BN, warps)
        reg = [[0, 1], [8, 0]] + [[0, 8 << i] for i in range((BKH // 8).bit_length() - 1)] + extra
        return gl.DistributedLinearLayout(
            reg_bases=reg, lane_bases=[[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]],
            warp_bases=warp_bases, block_bases=[], shape=[BN, BKH])

    @gluon.constexpr_function
    def group_cols_layout(BN, warps):
        """Register layout of a [BN, 8] tile of per-group scales (8 consecutive groups of BN rows):
        lane (g, t) of a warp holds rows g and g+8 of its 16, all 8 groups; the 4 lanes t share them
        (the rows of the wgmma fragments)."""
        extra, warp_bases = fragment_rows(BN, warps)
        return gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 2], [0, 4], [8, 0]] + extra, lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]],
            warp_bases=warp_bases, block_bases=[], shape=[BN, 8])

    @gluon.jit
    def _pick(t, bit):
        """[BN, 2n] -> [BN, n]: of each column pair (2c, 2c+1), the second where `bit` is set."""
        a, b = gl.split(gl.reshape(t, [t.shape[0], t.shape[1] // 2, 2]))
        return gl.where(bit, b, a)

    @gluon.jit
    def pick_column(t, j, target: gl.constexpr):
        """Column j (0..7) of a [BN, 8] register tile (`group_cols_layout`), as fp32 in `target`:
        three halving selects."""
        v = _pick(_pick(_pick(t, (j & 1) != 0), (j & 2) != 0), (j & 4) != 0)
        return gl.convert_layout(gl.reshape(v, [t.shape[0]]).to(gl.float32), target)

    @gluon.jit
    def group_column(buf, j, target: gl.constexpr, BN: gl.constexpr, WARPS: gl.constexpr):
        """Column j (0..7) of a [BN, 8] fp16 tile in shared memory, as fp32 in `target` (the rows of
        a fragment layout): a TMA box row is at least 16 bytes, so the load warp copies 8 groups."""
        return pick_column(buf.load(group_cols_layout(BN, WARPS)), j, target)

    @gluon.jit
    def _fill_tma_slot(x_desc, w_desc, sc_desc, mn_desc, sum_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, sum_bufs,
                       ready, empty, i, m0, n0, g, BLOCKS: gl.constexpr, SUMS: gl.constexpr, PDL: gl.constexpr = False,
                       npre=0, LOADS: gl.constexpr = 7):
        """Ring slot of this program's i-th K tile (= group g of the tile at (m0, n0)): wait until
        it is free, then TMA its codes, weight bytes, scale / min boxes and (SUMS) code sums. With
        PDL, slots below npre hold their weights, scales and mins already (`_prefill_group_weights`):
        only the codes (and sums) are left. LOADS (timing experiments only, without PDL; wrong results): which
        boxes the slot gets, bit 1 the codes, 2 the weight bytes, 4 the scales and mins (7: all)."""
        BKX: gl.constexpr = x_desc.block_type.shape[1]
        STAGES: gl.constexpr = x_bufs.type.shape[0]
        s = i % STAGES
        if PDL:  # (the plain call repeated below: a shared runtime flag costs the non-PDL kernel a warp sync)
            if i < npre:
                _tma_load(x_desc, [m0, g * BKX], ready.index(s), x_bufs.index(s))
                if SUMS:
                    _tma_load(sum_desc, [g, m0], ready.index(s), sum_bufs.index(s))
            else:
                _fill_whole_slot(x_desc, w_desc, sc_desc, mn_desc, sum_desc, x_bufs, w_bufs, sc_bufs, mn_bufs,
                                 sum_bufs, ready, empty, i, m0, n0, g, BLOCKS, SUMS)
        else:
            _fill_whole_slot(x_desc, w_desc, sc_desc, mn_desc, sum_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, sum_bufs,
                             ready, empty, i, m0, n0, g, BLOCKS, SUMS, LOADS)

    @gluon.jit
    def _fill_whole_slot(x_desc, w_desc, sc_desc, mn_desc, sum_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, sum_bufs,
                         ready, empty, i, m0, n0, g, BLOCKS: gl.constexpr, SUMS: gl.constexpr,
                         LOADS: gl.constexpr = 7):
        STAGES: gl.constexpr = x_bufs.type.shape[0]
        BKX: gl.constexpr = x_desc.block_type.shape[1]
        NB: gl.constexpr = ((x_desc.block_type.nbytes if LOADS & 1 else 0) + (w_desc.block_type.nbytes if LOADS & 2
                            else 0) + (2 * sc_desc.block_type.nbytes if LOADS & 4 else 0)
                            + (sum_desc.block_type.nbytes if SUMS else 0))
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), NB)
        tma_tiles(x_desc, w_desc, x_bufs.index(s), w_bufs.index(s), ready.index(s), m0, n0, g * BKX, BLOCKS,
                  (LOADS & 1) != 0, (LOADS & 2) != 0)
        if LOADS & 4:
            _tma_load(sc_desc, [n0, g // 8 * 8], ready.index(s), sc_bufs.index(s))
            _tma_load(mn_desc, [n0, g // 8 * 8], ready.index(s), mn_bufs.index(s))
        if SUMS:
            _tma_load(sum_desc, [g, m0], ready.index(s), sum_bufs.index(s))

    @gluon.jit
    def _prefill_group_weights(x_desc, w_desc, sc_desc, mn_desc, sum_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, ready,
                               n0, t0, npre, BLOCKS: gl.constexpr, SUMS: gl.constexpr):
        """PDL: the weight bytes, scales and mins of the first `npre` ring slots (their `ready`
        expects the whole slot), requested before `grid_wait`: nobody writes them."""
        BKX: gl.constexpr = x_desc.block_type.shape[1]
        NB: gl.constexpr = (x_desc.block_type.nbytes + w_desc.block_type.nbytes + 2 * sc_desc.block_type.nbytes
                            + (sum_desc.block_type.nbytes if SUMS else 0))
        for i in range(npre):
            g = t0 + i
            mbarrier.expect(ready.index(i), NB)
            tma_tiles(x_desc, w_desc, x_bufs.index(i), w_bufs.index(i), ready.index(i), 0, n0, g * BKX, BLOCKS,
                      LOAD_X=False)
            _tma_load(sc_desc, [n0, g // 8 * 8], ready.index(i), sc_bufs.index(i))
            _tma_load(mn_desc, [n0, g // 8 * 8], ready.index(i), mn_bufs.index(i))

    @gluon.jit
    def _load_partition_tma(x_desc, w_desc, sc_desc, mn_desc, sum_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, sum_bufs,
                            ready, empty, m0, n0, t0, num_k, BLOCKS: gl.constexpr, SUMS: gl.constexpr = True,
                            PDL: gl.constexpr = False, LOADS: gl.constexpr = 7):
        """One warp, TMA only (no register round trip: a load warp that waits for its own global
        loads each tile paced the whole kernel): per K tile (= group g) the codes and weight bytes,
        the scales and mins of groups 8 (g / 8) .. + 7 of the BN rows, and with SUMS the BM tokens'
        code sums over group g (from the quantizer's [K / G, M] sums; without, sum_desc and
        sum_bufs are not touched). With PDL the first ring's weights, scales and mins are requested
        before `grid_wait`, the codes after it. LOADS: see `_fill_tma_slot`."""
        STAGES: gl.constexpr = x_bufs.type.shape[0]
        npre = 0
        if PDL:
            launch_dependents(PDL)
            npre = gl.minimum(num_k, STAGES)
            _prefill_group_weights(x_desc, w_desc, sc_desc, mn_desc, sum_desc, x_bufs, w_bufs, sc_bufs, mn_bufs,
                                   ready, n0, t0, npre, BLOCKS, SUMS)
            grid_wait(PDL)
        for i in range(num_k):
            _fill_tma_slot(x_desc, w_desc, sc_desc, mn_desc, sum_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, sum_bufs,
                           ready, empty, i, m0, n0, t0 + i, BLOCKS, SUMS, PDL, npre, LOADS)

    @gluon.jit
    def _load_partition_tma_sk(x_desc, w_desc, sc_desc, mn_desc, sum_desc, x_bufs, w_bufs, sc_bufs, mn_bufs,
                               sum_bufs, ready, empty, T, per, dpt, KT, MT, BLOCKS: gl.constexpr,
                               SUMS: gl.constexpr, PDL: gl.constexpr = False):
        """The same slots for a stream-K program (`w4a16_wgmma.stream_k_segment`): its whole tiles,
        then its run of (output tile, K tile) iterations, one tile's K range at a time. With PDL it
        lets the next kernel in and waits for the previous one before its first load."""
        BM: gl.constexpr = x_desc.block_type.shape[0]
        BN: gl.constexpr = sc_desc.block_type.shape[0]
        launch_dependents(PDL)
        grid_wait(PDL)
        i = 0
        for seg in range(2):
            start, end, first, last, step = stream_k_segment(T, per, dpt, KT, seg)
            for t in range(first, last + 1, step):
                m0, n0 = stream_k_tile(t, MT, BM, BN)
                for g in range(gl.maximum(start - t * KT, 0), gl.minimum(end - t * KT, KT)):
                    _fill_tma_slot(x_desc, w_desc, sc_desc, mn_desc, sum_desc, x_bufs, w_bufs, sc_bufs, mn_bufs,
                                   sum_bufs, ready, empty, i, m0, n0, g, BLOCKS, SUMS)
                    i += 1

    # {b0, b0, b1, b1} -> {lo(b0), hi(b0), lo(b1), hi(b1)}: three ALU ops per four weights
    _SPLIT = gl.constexpr("{ .reg .b32 t; shr.b32 t, $1, 4; and.b32 t, t, 0x0F000F00; "
                          "and.b32 $0, $1, 0x000F000F; or.b32 $0, $0, t; }")

    @gluon.jit
    def split_nibbles(b2):
        """b2: the uint8 tile with each byte twice ([BN, BK], the fragment layout) -> the int8
        weights 0..15, low nibble first, four per 32-bit register."""
        return gl.inline_asm_elementwise(_SPLIT, "=r,r", [b2], dtype=gl.int8, is_pure=True, pack=4)

    @gluon.jit
    def _i8_mma_partition(x_bufs, w_bufs, sc_bufs, mn_bufs, sum_bufs, ready, empty, y_ptr, ws_ptr, cnt_ptr,
                          xs_ptr, m0, n0, M, N, t0, num_k, ROW0: gl.constexpr, BN: gl.constexpr, NPART: gl.constexpr,
                          SPLIT_K: gl.constexpr, WARPS: gl.constexpr, ABLATE: gl.constexpr, VEC: gl.constexpr):
        """Weight rows [ROW0, ROW0 + BN) of the tile: per K tile (= group) an int32 wgmma, then
        acc += s * partial + min * codesum in fp32. Everything a tile needs from shared memory
        is read before its wgmma, so the slot goes back right after it: each `mbarrier.arrive` and
        each first shared read after one costs a warpgroup barrier (measured: a third of all stall
        cycles when the scales were read after the wgmma).
        ABLATE (timing experiments only, wrong results): bit 1 drops the fp32 scale-after, bit 2
        the weight split (constant A), bit 4 the wgmma."""
        STAGES: gl.constexpr = x_bufs.type.shape[0]
        BM: gl.constexpr = x_bufs.type.shape[1]
        BKX: gl.constexpr = x_bufs.type.shape[2]
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, BM, 32])
        dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
        bl: gl.constexpr = byte_layout_i8(BN, BKX // 2, WARPS)
        acc = gl.zeros([BN, BM], gl.float32, layout=mma)
        part = gl.zeros([BN, BM], gl.int32, layout=mma)  # each tile overwrites it (use_acc=False)
        for i in range(num_k):
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            j = (t0 + i) % 8  # the tile's group among the 8 of the scale box
            sc = group_column(sc_bufs.index(s).slice(ROW0, BN), j, gl.SliceLayout(1, mma), BN, WARPS)
            mn = group_column(mn_bufs.index(s).slice(ROW0, BN), j, gl.SliceLayout(1, mma), BN, WARPS)
            xsum = sum_bufs.index(s).reshape([BM]).load(gl.SliceLayout(0, mma))
            if ABLATE & 2:
                a = gl.full([BN, BKX], i, gl.int8, layout=dot)
            else:
                b = w_bufs.index(s).reshape([BN * NPART, BKX // 2]).slice(ROW0, BN).load(bl)
                q = split_nibbles(gl.reshape(gl.join(b, b), [BN, BKX]))
                a = gl.convert_layout(q, dot, assert_trivial=True)
            if ABLATE & 4:
                part = part + gl.convert_layout(gl.sum(a.to(gl.int32), 1), gl.SliceLayout(1, mma))[:, None]
            else:
                part = warpgroup_mma(a, x_bufs.index(s).permute((1, 0)), part, use_acc=False, is_async=True)
                # retire before the next tile's A registers are built (see w4a16_wgmma's register-A note)
                part = warpgroup_mma_wait(0, deps=(part,))
            mbarrier.arrive(empty.index(s))
            if ABLATE & 1:
                acc += part.to(gl.float32, bitcast=True)
            else:
                f = (part + _MAGIC_BITS).to(gl.float32, bitcast=True)  # MAGIC + partial, exactly
                # explicit FMAs: left to contraction, a reordering of this loop once turned the first
                # into a multiply and an add (round(MAGIC * s) loses about s / 2 per group)
                acc += gl.fma(f, sc[:, None], (-_MAGIC * sc)[:, None])  # round(partial * s)
                acc = gl.fma(mn[:, None], xsum[None, :], acc)
        _store_tile(acc, mma, y_ptr, ws_ptr, cnt_ptr, xs_ptr, m0, n0 + ROW0, M, N, ROW0 // BN, NPART, SPLIT_K, True,
                    WARPS, VEC)

    # (M unspecialized: see `w4a16_wgmma_kernel`)
    @gluon.jit(do_not_specialize=("M",))
    def w4a8_int8_wgmma_kernel(x_desc, w_desc, sc_desc, mn_desc, sum_desc, xs_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K,
                               G: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, BLOCKS: gl.constexpr,
                               SPLIT_K: gl.constexpr, CONSUMERS: gl.constexpr, num_warps: gl.constexpr,
                               ABLATE: gl.constexpr = 0, VEC_STORE: gl.constexpr = False):
        BM: gl.constexpr = x_desc.block_type.shape[0]
        BKX: gl.constexpr = x_desc.block_type.shape[1]
        gl.static_assert(BKX == G, "one K tile per quantization group")
        m0 = gl.program_id(1) * BM
        n0 = gl.program_id(0) * BN
        x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
        w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
        sc_bufs = gl.allocate_shared_memory(gl.float16, [STAGES, BN, 8], sc_desc.layout)
        mn_bufs = gl.allocate_shared_memory(gl.float16, [STAGES, BN, 8], mn_desc.layout)
        sum_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BM], sum_desc.layout)
        ready, empty = ring_barriers(STAGES, 1, CONSUMERS)  # ready: the TMA bytes
        t0, num_k = k_slice(K, BKX, SPLIT_K)
        if CONSUMERS == 1:
            gl.warp_specialize([
                (_i8_mma_partition, (x_bufs, w_bufs, sc_bufs, mn_bufs, sum_bufs, ready, empty, y_ptr, ws_ptr,
                                     cnt_ptr, xs_ptr, m0, n0, M, N, t0, num_k, 0, BN, 1, SPLIT_K, num_warps,
                                     ABLATE, VEC_STORE)),
                (_load_partition_tma, (x_desc, w_desc, sc_desc, mn_desc, sum_desc, x_bufs, w_bufs, sc_bufs, mn_bufs,
                                       sum_bufs, ready, empty, m0, n0, t0, num_k, BLOCKS)),
            ], [1], [64])
        else:
            half: gl.constexpr = BN // 2
            gl.warp_specialize([
                (_i8_mma_partition, (x_bufs, w_bufs, sc_bufs, mn_bufs, sum_bufs, ready, empty, y_ptr, ws_ptr,
                                     cnt_ptr, xs_ptr, m0, n0, M, N, t0, num_k, 0, half, 2, SPLIT_K, num_warps,
                                     ABLATE, VEC_STORE)),
                (_i8_mma_partition, (x_bufs, w_bufs, sc_bufs, mn_bufs, sum_bufs, ready, empty, y_ptr, ws_ptr,
                                     cnt_ptr, xs_ptr, m0, n0, M, N, t0, num_k, half, half, 2, SPLIT_K, num_warps,
                                     ABLATE, VEC_STORE)),
                (_load_partition_tma, (x_desc, w_desc, sc_desc, mn_desc, sum_desc, x_bufs, w_bufs, sc_bufs, mn_bufs,
                                       sum_bufs, ready, empty, m0, n0, t0, num_k, BLOCKS)),
            ], [num_warps, 1], [232, 40])

    def _code_descriptor(codes: torch.Tensor, bm: int, bk: int):
        return TensorDescriptor.from_tensor(codes, [bm, bk], act_layout(bm, bk, gl.int8))

    def group_descriptors(store: Int4Weight, bn: int):
        """TMA descriptors of the scales and mins [N, K / G]: [bn, 8] boxes (8 groups); built once
        per store and bn (`store_descriptors`)."""
        def build():
            layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
            return (TensorDescriptor.from_tensor(store.scales, [bn, 8], layout),
                    TensorDescriptor.from_tensor(store.mins, [bn, 8], layout))

        return store_descriptors(store, ("groups", bn), build)

    def _sums_descriptor(sums_t: torch.Tensor, bm: int):
        """The code sums [K / G, M] (rows 16-byte aligned): one [1, bm] box per group."""
        layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
        return TensorDescriptor.from_tensor(sums_t, [1, bm], layout)


#: (BM tokens, BN weight rows, warps, stages, register cap, split-K). BK is the group size.
#: The int32 partial and the fp32 accumulator both live in registers: BM * BN / threads <= 64 each.
_CONFIGS = ((64, 64, 4, 6, 128, 1), (64, 64, 4, 4, 128, 2), (128, 64, 4, 4, 0, 1), (128, 64, 4, 4, 168, 1),
            (128, 128, 8, 4, 0, 1), (128, 128, 8, 3, 0, 1), (64, 128, 8, 6, 0, 1), (128, 64, 4, 4, 0, 2),
            (128, 128, 8, 4, 0, 2), (64, 128, 8, 4, 0, 2))


def int8_wgmma_configs(m: int, group: int = 128) -> list[TileConfig]:
    """The tiles worth profiling at this M."""
    if m < 64:
        return []
    return [TileConfig(bm, bn, group, sk, w, st, maxnreg=r) for bm, bn, w, st, r, sk in _CONFIGS if bm <= max(64, m)]


def smem_bytes(cfg: TileConfig) -> int:
    return cfg.stages * (cfg.bm * cfg.bk + cfg.bn * cfg.bk // 2 + 32 * cfg.bn + 4 * cfg.bm) + 1024


def int8_tile_fits(store, act, cfg: TileConfig | None, smem: int, rows_per_warp: tuple[int, ...] = (16,),
                   acc_regs: int = 64, bms: tuple[int, ...] = (64, 128)) -> bool:
    """The rules the two int8-wgmma W4A8 kernels share: int8 / int4 per-token codes, one K tile
    per group of 64 or 128, BN = 16 rows per warp with A in registers (or as many as
    `rows_per_warp` allows), BM in `bms`, the accumulators within `acc_regs` registers per thread,
    `smem` bytes of shared memory, [BN, 8] scale boxes (K / G % 8 == 0)."""
    if not HAS_GLUON or not isinstance(store, Int4Weight) or cfg is None:
        return False
    if getattr(act, "dtype", None) not in INT8_CODES or getattr(act, "group_size", 0) is not None:
        return False
    n, k, g = store.out_features, store.in_features, store.group_size
    if cfg.bk != g or g not in (64, 128) or cfg.split_k not in (1, 2, 4) or cfg.bm not in bms:
        return False
    if cfg.warps not in (4, 8) or cfg.bn not in [r * cfg.warps for r in rows_per_warp] or cfg.a_smem:
        return False
    if cfg.stream_k and (cfg.split_k != 1 or cfg.stream_k > 4):  # stream-K splits K itself
        return False
    if cfg.hybrid and not cfg.stream_k:  # (a hybrid is a stream-K launch)
        return False
    if cfg.bm * cfg.bn // (32 * cfg.warps) > acc_regs or smem > 227 * 1024:
        return False
    if n % cfg.bn or k % g or k // g < 2 * cfg.split_k or (k // g) % 8 or store.scales.dtype != torch.float16:
        return False
    return _is_sm90_or_cpu()


def int8_wgmma_supports(store, act, cfg: TileConfig | None) -> bool:
    return (cfg is not None and not cfg.stream_k and int8_tile_fits(store, act, cfg, smem_bytes(cfg))
            and fused_group_sums(store.in_features, store.group_size))


def w4a8_int8_wgmma(x2: torch.Tensor, store: Int4Weight, act, cfg: TileConfig) -> torch.Tensor:
    """x2 [M, K] bf16/fp16 -> [M, N]: the activations quantized per token to int8 codes (with
    their per-group sums), then the int8 wgmma kernel."""
    if not int8_wgmma_supports(store, act, cfg):
        raise ValueError(f"w4a8_int8_wgmma cannot run {cfg} with activations {act} on this store/device "
                         f"({store.out_features}x{store.in_features}, group {getattr(store, 'group_size', '?')}); "
                         "int8_wgmma_supports() says which")
    codes, scales, sums = quantize_act_triton(x2, act, group_sums=store.group_size, sums_by_group=True)
    return int8_wgmma_codes(codes, scales, sums, store, cfg, x2.dtype)


def int8_wgmma_codes(codes: torch.Tensor, scales: torch.Tensor, sums: torch.Tensor, store: Int4Weight,
                     cfg: TileConfig, out_dtype: torch.dtype, ablate: int = 0) -> torch.Tensor:
    """The kernel on already quantized activations: codes [M, K] int8, scales [M] fp32, sums
    [K / G, M] fp32 with 16-byte aligned rows (`quantize_act_triton(..., sums_by_group=True)`).
    `ablate` != 0 only for timing experiments (see `_i8_mma_partition`)."""
    m, n, k = codes.shape[0], store.out_features, store.in_features
    if sums.shape != (k // store.group_size, m) or sums.stride(1) != 1 or (sums.stride(0) * 4) % 16:
        raise ValueError(f"code sums must be [K / G, M] = [{k // store.group_size}, {m}] with 16-byte aligned rows "
                         f"(quantize_act_triton(..., sums_by_group=True)); got {tuple(sums.shape)}, "
                         f"strides {sums.stride()}")
    y = torch.empty((m, n), device=codes.device, dtype=out_dtype)
    x_desc = _code_descriptor(codes, cfg.bm, cfg.bk)
    w_desc = _weight_descriptor(store, cfg.bn, cfg.bk)  # swizzled (w4a16_wgmma.SWIZZLE_WEIGHTS)
    sc_desc, mn_desc = group_descriptors(store, cfg.bn)
    consumers = 2 if cfg.warps == 8 else 1
    grid = (n // cfg.bn, -(-m // cfg.bm), cfg.split_k)
    ws, cnt = splitk_buffers(y, cfg.split_k, m * n, grid[0] * grid[1] * consumers)
    regs = cfg.maxnreg or (TWO_CONSUMER_REGS if consumers == 2 else 0)
    sum_desc = _sums_descriptor(sums, cfg.bm)
    w4a8_int8_wgmma_kernel[grid](x_desc, w_desc, sc_desc, mn_desc, sum_desc, scales, y, ws, cnt, m, n, k,
                                 G=store.group_size, BN=cfg.bn, STAGES=cfg.stages, BLOCKS=store.layout == BLOCKS16,
                                 SPLIT_K=cfg.split_k, CONSUMERS=consumers, num_warps=cfg.warps // consumers,
                                 ABLATE=ablate, VEC_STORE=W16.WGMMA_VEC_STORE, **({"maxnreg": regs} if regs else {}))
    return y


def w4a8_int8_wgmma_emulate(codes: torch.Tensor, scales: torch.Tensor, store: Int4Weight,
                            out_dtype: torch.dtype) -> torch.Tensor:
    """The kernel's numerics in torch: exact per-group integer products, then in fp32 per group
    acc += round(s * partial), acc += min * codesum, and the token scale at the end."""
    g = store.group_size
    q = store.unpacked().to(torch.float64)  # [N, K], 0..15
    c = codes.to(torch.float64)
    m, k = c.shape
    acc = torch.zeros((store.out_features, m), dtype=torch.float32, device=c.device)
    for j in range(k // g):
        cols = slice(j * g, (j + 1) * g)
        part = (q[:, cols] @ c[:, cols].t())  # exact: |partial| < 2^22
        s = store.scales[:, j].float()[:, None]
        mn = store.mins[:, j].float()[:, None]
        acc = acc + (part * s.double()).float()  # round(partial * s), then an fp32 add
        acc = (acc.double() + mn.double() * c[:, cols].sum(1)[None, :]).float()  # one FMA
    return (acc * scales.float().reshape(1, -1)).t().to(out_dtype)
