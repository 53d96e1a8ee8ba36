"""W4A8 / W4A4 for M >= 64 on Hopper's int8 tensor cores, for int4 stores whose groups are exact
int8 multiples of a per-row power of two (`quantize_int4_progressive`, QServe's progressive
group quantization).

Why: `w4a8_int8_wgmma` must rescale every group's int32 partial in fp32 (4 ALU operations per
output element per group, the measured limiter: docs/kernels_history.md, stop 16). Here a group's
weights are t * q - tz with small integers t, tz, so one byte of two codes becomes two int8
weights in registers and the int32 accumulator runs over the whole K without a rescale:

    y[n, m] = unit[n] * xscale[m] * sum_k (t[n, g(k)] q[n, k] - tz[n, g(k)]) c[m, k]

DPR: P_W = (4) widened to an 8-bit weight by an integer multiply-add, P_X = (8) (W4A4's int4
codes are int8 too), int32 products over all of K, reconstructed once per output in the epilogue.

The int8 weights are built on 32-bit registers only: the byte tile is read from shared memory as
int32 words (two lanes per word), each lane's half of a word spread into 16-bit lanes (PRMT), the
codes masked apart, one IMAD per lane pair, `lane = q * t + 256 - tz` (its low byte is t * q - tz
in two's complement, the lane never carries), one PRMT that gathers four low bytes: 7
instructions per four weights. (On int8 tensors, Triton turns joins into byte shuffles: the
first version's loop had 293 SASS instructions per K tile, this one 229; docs/kernels_history.md, stop 19.)
t and tz come from the fp16 scale and min the load warp already copies (scale = t * unit and
min = -tz * unit exactly, `Int4Weight.row_units`), times 1 / unit, which is exact.

Partitions, TMA boxes and the deterministic split-K are those of `w4a8_int8_wgmma`, without the
code sums. CPU: `w4a8_progressive_emulate` is the torch model of the numerics; Gluon has no
interpreter, so the tests compile for sm_90 there and compare on a Hopper GPU.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch

from gearshift.kernels.act_quant import quantize_act_triton
from gearshift.kernels.config import TileConfig
from gearshift.kernels.pdl import launch_kwargs, pdl_enabled
from gearshift.kernels.splitk import counters, splitk_buffers
from gearshift.kernels.tile_room import whole_tiles
from gearshift.kernels.w4a16_wgmma import (HAS_GLUON, TWO_CONSUMER_REGS, _weight_descriptor, stream_k_launch,
                                           stream_k_runs)
from gearshift.kernels.w4a8_wgmma import int8_tile_fits
from gearshift.quant.int4 import BLOCKS16, Int4Weight

#: launch with programmatic dependent launch (`kernels/pdl.py`): the load warp lets the next kernel
#: in at once and requests the first ring's weights, scales and mins before waiting for the codes.
#: Off by default: on the H100 the whole W4A8 step took 1.064 / 1.041 / 1.011 / 0.993 / 0.991 of
#: its time without PDL at M = 64 / 128 / 256 / 512 / 1024 (stop 26, `policy_ab.py --set-a
#: w4a8_progressive.PROGRESSIVE_PDL=0`). GEARSHIFT_PROGRESSIVE_PDL=1 turns it on; results are identical.
PROGRESSIVE_PDL = os.environ.get("GEARSHIFT_PROGRESSIVE_PDL", "0") not in ("0", "", "false", "False")

#: finished tiles stored through `w4a16_wgmma.store_rows`' row-contiguous layout (16-byte stores; at
#: BM = 256 both token halves rounded before either store, which removes the 244-byte spill of the
#: 256 x 128 tile). Identical results; GEARSHIFT_PROGRESSIVE_VEC_STORE=0 turns it off.
PROGRESSIVE_VEC_STORE = os.environ.get("GEARSHIFT_PROGRESSIVE_VEC_STORE", "1") not in ("0", "", "false", "False")
#: where the codes' storage ends at them (`tile_room.whole_tiles`), pad them to whole token tiles (one `pad_rows`
#: launch) where at least this many rows of the last tile lie past them; -1: never. TMA boxes with many absent rows
#: read slowly (as `w4a16_wgmma.tma_rows` found for W4A16), but the copy costs about 1-2 us a linear, and more at
#: K = 14336 (down lost 12 us at 513 tokens). Stop 72, H200 step (`policy_ab.py --mode w4a8 --int4-prog
#: --norm-codes --set-a w4a8_progressive.PAD_ABSENT_ROWS=-1`, exact-row producers): `tma_rows`' rule (3/8 of the
#: last tile, 2/8 of an only one) lost 4-10% at 65 / 80 / 96 / 200 tokens (32-63 rows absent); this one takes the
#: step to 0.80 / 0.94 / 0.80 / 0.87 / 0.95 of never at 129 / 160 / 257 / 300 / 513 tokens, 0.99-1.02 elsewhere.
PAD_ABSENT_ROWS = 96
#: shared memory the row stores' layout conversion takes with fp32 outputs (tests and emulation
#: checks; bf16 takes about 3 KB): 31.8 KB compiled for the two-consumer tiles, 15.5 KB for one
FP32_STORE_SCRATCH = 32 * 1024


def vec_store(cfg: TileConfig, out_dtype: torch.dtype) -> bool:
    """Whether this launch stores through `store_rows` (the same bits either way): not where the
    fp32 conversion scratch would not fit beside the ring (128 x 256 with 5 stages needed 237664
    bytes of the 232448)."""
    return PROGRESSIVE_VEC_STORE and (out_dtype != torch.float32 or
                                      smem_bytes(cfg) + FP32_STORE_SCRATCH <= 227 * 1024)


if HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

    from gearshift.kernels.w4a16_wgmma import (_store_segment_sk, _store_tile, fragment_rows, k_slice, ring_barriers,
                                               store_rows, stream_k_segment, stream_k_tile, token_scaled)
    from gearshift.kernels.w4a8_wgmma import (_code_descriptor, _load_partition_tma, _load_partition_tma_sk,
                                              group_column, group_descriptors)

    # Triton 3.6 names it _reinterpret, later releases reinterpret
    _NEW_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))

    @gluon.jit
    def as_words(buf, rows: gl.constexpr, cols: gl.constexpr, layout: gl.constexpr):
        """The byte tile `buf` [rows, 4 cols] as int32 words [rows, cols] in shared layout `layout`."""
        if _NEW_REINTERPRET:
            return buf.reinterpret(gl.int32, [rows, cols], layout)
        else:
            return buf._reinterpret(gl.int32, [rows, cols], layout)

    @gluon.constexpr_function
    def word_layout(BN, BK, warps):
        """[BN, BK/8, 8] layout whose reshape to [BN, BK] is the int8 wgmma A fragment (lane (g, t):
        rows g, g+8, weights 4t..4t+3 + 16 i) and whose last axis (the 8 weights of a 32-bit word
        of codes) is all registers and one lane bit: sliced on that axis, two lanes load each word."""
        extra, warp_bases = fragment_rows(BN, warps)
        reg = ([[0, 0, 1], [0, 0, 2], [8, 0, 0]] + [[0, 2 << i, 0] for i in range((BK // 16).bit_length() - 1)]
               + [[r, 0, 0] for r, _ in extra])
        return gl.DistributedLinearLayout(
            reg_bases=reg, lane_bases=[[0, 0, 4], [0, 1, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
            warp_bases=[[w, 0, 0] for w, _ in warp_bases], block_bases=[], shape=[BN, BK // 8, 8])

    # $1: the 32-bit word of codes that holds this lane's 4 weights (8 codes: its low or high half);
    # $5: the PRMT selector that spreads that half's two bytes into 16-bit lanes ({b0, 0, b1, 0});
    # $9: t, $13: (256 - tz) * 0x10001 of the row. Codes (q0, q2) and (q1, q3) are masked apart
    # in their lanes, q * t + 256 - tz per lane (< 2^16: no carry between lanes; the low byte is
    # t * q - tz in two's complement), one PRMT gathers the four low bytes in k order: 7
    # instructions per four weights, on 32-bit registers only (no int8 shuffles)
    _INT8_WEIGHTS = gl.constexpr(
        "{ .reg .b32 x, a, h; prmt.b32 x, $1, 0, $5; and.b32 a, x, 0x000F000F; shr.u32 h, x, 4; "
        "and.b32 h, h, 0x000F000F; mad.lo.u32 a, a, $9, $13; mad.lo.u32 h, h, $9, $13; "
        "prmt.b32 $0, a, h, 0x6240; }")
    #: the selectors of the low / high half of a word
    _LOW_HALF = gl.constexpr(0x5140)
    _HIGH_HALF = gl.constexpr(0x7362)

    @gluon.jit
    def int8_weights(words, sel, t, c):
        """words, sel: [BN, BK] int32 in the A-fragment layout (each weight's code word and the
        selector of its half); t, c: [BN, 1] int32 per row -> the int8 weights [BN, BK]."""
        return gl.inline_asm_elementwise(_INT8_WEIGHTS, "=r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r", [words, sel, t, c],
                                         dtype=gl.int8, is_pure=True, pack=4)

    @gluon.jit
    def _fragment_setup(BN: gl.constexpr, BKX: gl.constexpr, WARPS: gl.constexpr):
        """The loop-invariant register tensors of the weight build: zero tensors in the word and
        A-fragment layouts and each weight's half-word selector."""
        wl3: gl.constexpr = word_layout(BN, BKX, WARPS)
        zeros3 = gl.zeros([BN, BKX // 8, 8], gl.int32, layout=wl3)
        # the A-fragment layout of [BN, BK] (the [BN, BK/8, 8] broadcast, reshaped)
        zeros = gl.reshape(zeros3, [BN, BKX])
        j8 = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(0, wl3)))  # a weight's place in its word
        kk = gl.reshape(gl.expand_dims(gl.expand_dims(j8, 0), 0) + zeros3, [BN, BKX])
        sel = gl.where((kk & 4) != 0, _HIGH_HALF, _LOW_HALF) + zeros
        return zeros3, zeros, sel

    @gluon.jit
    def _k_tile_step(x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, i, j, inv, part, part2, zeros3, zeros, sel,
                     mma: gl.constexpr, ROW0: gl.constexpr, BN: gl.constexpr, NPART: gl.constexpr,
                     WARPS: gl.constexpr, SW: gl.constexpr, ABLATE: gl.constexpr):
        """Ring slot i (a K tile whose group is column j of the scale box): the int8 weights of rows
        [ROW0, ROW0 + BN) in registers, one or two int32 wgmmas into part (part2: the second token
        half at BM = 256), retired before the slot is handed back. ABLATE: see `_mma_partition`."""
        STAGES: gl.constexpr = x_bufs.type.shape[0]
        BM: gl.constexpr = x_bufs.type.shape[1]
        BKX: gl.constexpr = x_bufs.type.shape[2]
        BMH: gl.constexpr = 128 if BM > 128 else BM
        dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
        wl: gl.constexpr = gl.SliceLayout(2, word_layout(BN, BKX, WARPS))  # the [BN, BK/8] words, each in two lanes
        words32: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=SW, element_bitwidth=32, rank=2)
        rows: gl.constexpr = gl.SliceLayout(1, zeros.type.layout)
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        if ABLATE & 1:
            t = gl.full([BN], 1, gl.int32, layout=rows)
            c = gl.full([BN], 256 * 65537, gl.int32, layout=rows)
        else:
            t = (group_column(sc_bufs.index(s).slice(ROW0, BN), j, rows, BN, WARPS) * inv).to(gl.int32)
            ntz = (group_column(mn_bufs.index(s).slice(ROW0, BN), j, rows, BN, WARPS) * inv).to(gl.int32)
            c = (ntz + 256) * 65537
        if ABLATE & 2:
            a = gl.convert_layout((t[:, None] + c[:, None] + zeros).to(gl.int8), dot)
        else:
            wsm = as_words(w_bufs.index(s).reshape([BN * NPART, BKX // 2]), BN * NPART, BKX // 8, words32)
            w = wsm.slice(ROW0, BN).load(wl)
            wb = gl.reshape(gl.expand_dims(w, 2) + zeros3, [BN, BKX])
            a = gl.convert_layout(int8_weights(wb, sel, t[:, None], c[:, None]), dot, assert_trivial=True)
        if ABLATE & 4:
            part = part + gl.convert_layout(gl.sum(a.to(gl.int32), 1), gl.SliceLayout(1, mma))[:, None]
        elif BM > 128:
            part = warpgroup_mma(a, x_bufs.index(s).slice(0, BMH).permute((1, 0)), part, is_async=True)
            part2 = warpgroup_mma(a, x_bufs.index(s).slice(BMH, BMH).permute((1, 0)), part2, is_async=True)
            part, part2 = warpgroup_mma_wait(0, deps=(part, part2))
        else:
            part = warpgroup_mma(a, x_bufs.index(s).permute((1, 0)), part, is_async=True)
            part = warpgroup_mma_wait(0, deps=(part,))
        mbarrier.arrive(empty.index(s))
        return part, part2

    @gluon.jit
    def _mma_partition(x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, units_ptr, y_ptr, ws_ptr, cnt_ptr, xs_ptr,
                       m0, n0, M, N, t0, num_k, ROW0: gl.constexpr, BN: gl.constexpr, NPART: gl.constexpr,
                       SPLIT_K: gl.constexpr, WARPS: gl.constexpr, SW: gl.constexpr, ABLATE: gl.constexpr,
                       VEC: gl.constexpr, KPART: gl.constexpr = -1, red=None, done=None):
        """Weight rows [ROW0, ROW0 + BN) of the tile: per K tile the int8 weights in registers and
        one int32 wgmma into the running accumulator (retired before the next tile's A registers
        are built: see `w4a16_wgmma`'s register-A note); unit * float(acc) once at the end.
        ABLATE (timing experiments only, wrong results; `tc_ablations/progressive_parts.py`):
        bit 1 drops the scale / min pick (t = 1, tz = 0), bit 2 the weight build (constant A),
        bit 4 the wgmma (the A tile is summed into the accumulator instead, so it stays live).
        KPART 0 / 1 (`TileConfig.kwarps` = 2): two such partitions share the rows, each over every other K tile;
        partition 1 hands its int32 sums over in `red` (barrier `done`), partition 0 adds them (exact) and
        stores."""
        BM: gl.constexpr = x_bufs.type.shape[1]
        BKX: gl.constexpr = x_bufs.type.shape[2]
        # BM = 256: two m64n128 wgmmas on the same A registers (Triton lowers no int8 n256), so the
        # weights' integer build is shared by twice the tokens
        BMH: gl.constexpr = 128 if BM > 128 else BM
        TWO: gl.constexpr = BM > 128
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, BMH, 32])
        zeros3, zeros, sel = _fragment_setup(BN, BKX, WARPS)
        rows: gl.constexpr = gl.SliceLayout(1, zeros.type.layout)
        inv = 1.0 / gl.load(units_ptr + n0 + ROW0 + gl.arange(0, BN, layout=rows))  # powers of two: exact
        part = gl.zeros([BN, BMH], gl.int32, layout=mma)
        part2 = gl.zeros([BN, BMH], gl.int32, layout=mma)  # the second token half (unused unless TWO)
        FIRST: gl.constexpr = KPART if KPART >= 0 else 0
        STEP: gl.constexpr = 2 if KPART >= 0 else 1
        for i in range(FIRST, num_k, STEP):
            part, part2 = _k_tile_step(x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, i, (t0 + i) % 8, inv, part,
                                       part2, zeros3, zeros, sel, mma, ROW0, BN, NPART, WARPS, SW, ABLATE)
        if KPART == 1:
            red.store(part)
            mbarrier.arrive(done.index(0))
            return
        if KPART == 0:
            mbarrier.wait(done.index(0), 0)
            part = part + red.load(mma)
        unit = gl.load(units_ptr + n0 + ROW0 + gl.arange(0, BN, layout=gl.SliceLayout(1, mma)))
        if TWO and SPLIT_K == 1 and VEC:
            # both halves rounded to y's dtype before either store (the same operations, so the same
            # bits): storing the first half from the wgmma layout while the second's int32 sums
            # were live spilled 244 bytes per thread (ptxas 12.8; stop 27)
            DT: gl.constexpr = y_ptr.dtype.element_ty
            out = token_scaled(part.to(gl.float32) * unit[:, None], mma, xs_ptr, m0, M).to(DT)
            out2 = token_scaled(part2.to(gl.float32) * unit[:, None], mma, xs_ptr, m0 + BMH, M).to(DT)
            store_rows(out, mma, y_ptr, m0, n0 + ROW0, M, N, WARPS)
            store_rows(out2, mma, y_ptr, m0 + BMH, n0 + ROW0, M, N, WARPS)
            return
        acc = part.to(gl.float32) * unit[:, None]
        _store_tile(acc, mma, y_ptr, ws_ptr, cnt_ptr, xs_ptr, m0, n0 + ROW0, M, N, ROW0 // BN, NPART, SPLIT_K, True,
                    WARPS, VEC)
        if TWO:  # the second token half has its own split-K counters, after the first half's
            acc = part2.to(gl.float32) * unit[:, None]
            cnt2 = cnt_ptr + gl.num_programs(0) * gl.num_programs(1) * NPART
            _store_tile(acc, mma, y_ptr, ws_ptr, cnt2, xs_ptr, m0 + BMH, n0 + ROW0, M, N, ROW0 // BN, NPART, SPLIT_K,
                        True, WARPS, VEC)

    @gluon.jit
    def _mma_partition_sk(x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, units_ptr, y_ptr, ws_ptr, cnt_ptr, xs_ptr,
                          M, N, T, per, dpt, KT, MT, ROW0: gl.constexpr, BN: gl.constexpr, NPART: gl.constexpr,
                          WARPS: gl.constexpr, SW: gl.constexpr, CMAX: gl.constexpr, VEC: gl.constexpr):
        """A stream-K consumer: the program's run of (output tile, K tile) iterations, one tile's K
        range at a time; each range's int32 sums, times the rows' units, end in
        `_store_segment_sk` (one per token half at BM = 256)."""
        BM: gl.constexpr = x_bufs.type.shape[1]
        BKX: gl.constexpr = x_bufs.type.shape[2]
        BMH: gl.constexpr = 128 if BM > 128 else BM
        NHALF: gl.constexpr = 2 if BM > 128 else 1
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, BMH, 32])
        zeros3, zeros, sel = _fragment_setup(BN, BKX, WARPS)
        rows: gl.constexpr = gl.SliceLayout(1, zeros.type.layout)
        base = gl.num_programs(0) * dpt
        i = 0
        for seg in range(2):
            start, end, first, last, step = stream_k_segment(T, per, dpt, KT, seg)
            for t in range(first, last + 1, step):
                k_lo = gl.maximum(start - t * KT, 0)
                k_hi = gl.minimum(end - t * KT, KT)
                m0, n0 = stream_k_tile(t, MT, BM, BN * NPART)
                inv = 1.0 / gl.load(units_ptr + n0 + ROW0 + gl.arange(0, BN, layout=rows))  # powers of two: exact
                part = gl.zeros([BN, BMH], gl.int32, layout=mma)
                part2 = gl.zeros([BN, BMH], gl.int32, layout=mma)
                for g in range(k_lo, k_hi):
                    part, part2 = _k_tile_step(x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, i, g % 8, inv, part,
                                               part2, zeros3, zeros, sel, mma, ROW0, BN, NPART, WARPS, SW, 0)
                    i += 1
                unit = gl.load(units_ptr + n0 + ROW0 + gl.arange(0, BN, layout=gl.SliceLayout(1, mma)))
                _store_segment_sk(part.to(gl.float32) * unit[:, None], mma, y_ptr, ws_ptr, cnt_ptr, xs_ptr, t, first,
                                  k_lo, k_hi, m0, n0, M, N, per, base, KT, ROW0, NPART, 0, NHALF, True, WARPS, CMAX,
                                  VEC)
                if NHALF == 2:
                    _store_segment_sk(part2.to(gl.float32) * unit[:, None], mma, y_ptr, ws_ptr, cnt_ptr, xs_ptr, t,
                                      first, k_lo, k_hi, m0 + BMH, n0, M, N, per, base, KT, ROW0, NPART, 1, NHALF,
                                      True, WARPS, CMAX, VEC)

    # (M, and stream-K's run lengths, unspecialized: see `w4a16_wgmma_kernel`)
    @gluon.jit(do_not_specialize=("M", "per", "dpt"))
    def w4a8_progressive_kernel(x_desc, w_desc, sc_desc, mn_desc, units_ptr, xs_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K,
                                per, dpt, G: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, BLOCKS: gl.constexpr,
                                SPLIT_K: gl.constexpr, CONSUMERS: gl.constexpr, num_warps: gl.constexpr,
                                ABLATE: gl.constexpr = 0, STREAM_K: gl.constexpr = False, CMAX: gl.constexpr = 0,
                                PDL: gl.constexpr = False, VEC_STORE: gl.constexpr = False,
                                KSPLIT: gl.constexpr = False):
        """One output tile per program, or with STREAM_K a persistent grid of runs of `per`
        (tile, K tile) iterations (`w4a16_wgmma.stream_k_segment`). PDL: the load warp lets the next
        kernel in at once and requests the first ring's weights before waiting for the codes.
        KSPLIT: the two consumer partitions share all BN rows and split the K tiles between them.
        ABLATE bits 8, 16, 32 (timing only): no codes, no weight bytes, no scales and mins loaded
        (`w4a8_wgmma._fill_tma_slot`'s LOADS)."""
        BM: gl.constexpr = x_desc.block_type.shape[0]
        BKX: gl.constexpr = x_desc.block_type.shape[1]
        gl.static_assert(BKX == G, "one K tile per quantization group")
        x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
        SW: gl.constexpr = w_desc.layout.swizzle_byte_width
        w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
        sc_bufs = gl.allocate_shared_memory(gl.float16, [STAGES, BN, 8], sc_desc.layout)
        mn_bufs = gl.allocate_shared_memory(gl.float16, [STAGES, BN, 8], mn_desc.layout)
        ready, empty = ring_barriers(STAGES, 1, 1 if KSPLIT else CONSUMERS)  # ready: the TMA bytes
        half: gl.constexpr = BN // CONSUMERS
        if KSPLIT:
            gl.static_assert(CONSUMERS == 2 and BM <= 128 and not STREAM_K, "a K split of two plain consumers")
            m0 = gl.program_id(1) * BM
            n0 = gl.program_id(0) * BN
            t0, num_k = k_slice(K, BKX, SPLIT_K)
            red = gl.allocate_shared_memory(gl.int32, [BN, BM], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
            done = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
            mbarrier.init(done.index(0), count=1)
            gl.warp_specialize([
                (_mma_partition, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, units_ptr, y_ptr, ws_ptr,
                                  cnt_ptr, xs_ptr, m0, n0, M, N, t0, num_k, 0, BN, 1, SPLIT_K, num_warps, SW,
                                  ABLATE, VEC_STORE, 0, red, done)),
                (_mma_partition, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, units_ptr, y_ptr, ws_ptr,
                                  cnt_ptr, xs_ptr, m0, n0, M, N, t0, num_k, 0, BN, 1, SPLIT_K, num_warps, SW,
                                  ABLATE, VEC_STORE, 1, red, done)),
                (_load_partition_tma, (x_desc, w_desc, sc_desc, mn_desc, sc_desc, x_bufs, w_bufs, sc_bufs,
                                       mn_bufs, sc_bufs, ready, empty, m0, n0, t0, num_k, BLOCKS, False, PDL)),
            ], [num_warps, 1], [232, 40])
        elif STREAM_K:
            KT = K // BKX
            MT = gl.cdiv(M, BM)
            T = MT * (N // BN) * KT
            if CONSUMERS == 1:
                gl.warp_specialize([
                    (_mma_partition_sk, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, units_ptr, y_ptr, ws_ptr,
                                         cnt_ptr, xs_ptr, M, N, T, per, dpt, KT, MT, 0, BN, 1, num_warps, SW, CMAX,
                                         VEC_STORE)),
                    (_load_partition_tma_sk, (x_desc, w_desc, sc_desc, mn_desc, sc_desc, x_bufs, w_bufs, sc_bufs,
                                              mn_bufs, sc_bufs, ready, empty, T, per, dpt, KT, MT, BLOCKS, False, PDL)),
                ], [1], [64])
            else:
                gl.warp_specialize([
                    (_mma_partition_sk, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, units_ptr, y_ptr, ws_ptr,
                                         cnt_ptr, xs_ptr, M, N, T, per, dpt, KT, MT, 0, half, 2, num_warps, SW, CMAX,
                                         VEC_STORE)),
                    (_mma_partition_sk, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, units_ptr, y_ptr, ws_ptr,
                                         cnt_ptr, xs_ptr, M, N, T, per, dpt, KT, MT, half, half, 2, num_warps, SW, CMAX,
                                         VEC_STORE)),
                    (_load_partition_tma_sk, (x_desc, w_desc, sc_desc, mn_desc, sc_desc, x_bufs, w_bufs, sc_bufs,
                                              mn_bufs, sc_bufs, ready, empty, T, per, dpt, KT, MT, BLOCKS, False, PDL)),
                ], [num_warps, 1], [232, 40])
        else:
            m0 = gl.program_id(1) * BM
            n0 = gl.program_id(0) * BN
            t0, num_k = k_slice(K, BKX, SPLIT_K)
            LOADS: gl.constexpr = 7 - (ABLATE // 8) % 8
            if CONSUMERS == 1:
                gl.warp_specialize([
                    (_mma_partition, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, units_ptr, y_ptr, ws_ptr,
                                      cnt_ptr, xs_ptr, m0, n0, M, N, t0, num_k, 0, BN, 1, SPLIT_K, num_warps, SW,
                                      ABLATE, VEC_STORE)),
                    (_load_partition_tma, (x_desc, w_desc, sc_desc, mn_desc, sc_desc, x_bufs, w_bufs, sc_bufs,
                                           mn_bufs, sc_bufs, ready, empty, m0, n0, t0, num_k, BLOCKS, False, PDL,
                                           LOADS)),
                ], [1], [64])
            else:
                gl.warp_specialize([
                    (_mma_partition, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, units_ptr, y_ptr, ws_ptr,
                                      cnt_ptr, xs_ptr, m0, n0, M, N, t0, num_k, 0, half, 2, SPLIT_K, num_warps, SW,
                                      ABLATE, VEC_STORE)),
                    (_mma_partition, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, units_ptr, y_ptr, ws_ptr,
                                      cnt_ptr, xs_ptr, m0, n0, M, N, t0, num_k, half, half, 2, SPLIT_K, num_warps, SW,
                                      ABLATE, VEC_STORE)),
                    (_load_partition_tma, (x_desc, w_desc, sc_desc, mn_desc, sc_desc, x_bufs, w_bufs, sc_bufs,
                                           mn_bufs, sc_bufs, ready, empty, m0, n0, t0, num_k, BLOCKS, False, PDL,
                                           LOADS)),
                ], [num_warps, 1], [232, 40])


#: (BM tokens, BN weight rows, warps, stages, register cap, split-K); BK is the group size. BN = 256
#: gives each consumer warpgroup 128 rows (two m64 wgmmas, a 128-register accumulator at BM = 128):
#: a third less shared-memory fill per multiply-add than BN = 128. BM = 256 runs two m64n128
#: wgmmas on the same A registers (Triton 3.6 / 3.9 lower no int8 m64n256k32): half the weight
#: build per multiply-add.
_CONFIGS = ((64, 64, 4, 6, 128, 1), (128, 64, 4, 4, 0, 1), (128, 64, 4, 4, 168, 1), (128, 64, 4, 6, 0, 1),
            (128, 128, 8, 4, 0, 1), (128, 128, 8, 5, 0, 1), (128, 128, 8, 3, 0, 1), (64, 128, 8, 6, 0, 1),
            (128, 64, 4, 4, 0, 2), (128, 128, 8, 4, 0, 2), (64, 128, 8, 4, 0, 2), (128, 128, 8, 4, 0, 4),
            (128, 256, 8, 3, 0, 1), (128, 256, 8, 4, 0, 1), (128, 256, 8, 5, 0, 1), (64, 256, 8, 4, 0, 1),
            (64, 256, 8, 6, 0, 1), (128, 256, 8, 4, 0, 2),
            (256, 128, 8, 3, 0, 1), (256, 128, 8, 4, 0, 1), (256, 64, 4, 4, 0, 1), (256, 64, 4, 5, 0, 1),
            (256, 64, 4, 4, 0, 2), (256, 128, 8, 3, 0, 2),
            (64, 64, 4, 6, 128, 2), (64, 64, 4, 4, 128, 4))  # o / qkv at M = 64: 64-96 CTAs unsplit
#: tiles whose two consumer warpgroups share the BN rows and split the K tiles between them (`TileConfig.kwarps` = 2,
#: 8 warps): at 64 tokens a one-consumer tile's warpgroup issues on 36% of its schedulers' cycles, latency-bound
#: (stop 73, ncu), and split-K over programs pays for its workspace and counters: (BM, BN, stages, split-K)
_KSPLIT = ((64, 64, 6, 1), (64, 64, 4, 2), (128, 64, 4, 1), (128, 64, 4, 2), (64, 128, 4, 1), (128, 128, 3, 1))
#: stream-K tiles (stop 24; `w4a16_wgmma._STREAM_K` says why): (BM, BN, warps, stages, register cap,
#: programs per SM)
_STREAM_K = ((64, 64, 4, 6, 128, 2), (128, 64, 4, 4, 0, 1), (128, 64, 4, 4, 168, 1), (128, 128, 8, 4, 0, 1),
             (128, 256, 8, 4, 0, 1), (256, 128, 8, 3, 0, 1), (256, 64, 4, 4, 0, 1))
#: stream-K tiles also timed as hybrids (`TileConfig.hybrid`, from M = 256): (BM, BN, warps, stages).
#: Stop 28: 1.03-1.38x slower than the best plain tile on every Llama shape but gate_up at M = 512
#: (0.99); 128 x 256 and 128 x 128 hybrids were timed too and dropped
_HYBRID = ((256, 128, 8, 3),)


def progressive_configs(m: int, group: int = 128) -> list[TileConfig]:
    """The tiles worth profiling at this M."""
    if m < 64:
        return []
    return ([TileConfig(bm, bn, group, sk, w, st, maxnreg=r) for bm, bn, w, st, r, sk in _CONFIGS if bm <= max(64, m)]
            + [TileConfig(bm, bn, group, sk, 8, st, kwarps=2) for bm, bn, st, sk in _KSPLIT if bm <= max(64, m)]
            + [TileConfig(bm, bn, group, 1, w, st, maxnreg=r, stream_k=p, hybrid=h)
               for bm, bn, w, st, r, p in _STREAM_K for h in (False, True)
               if bm <= max(64, m) and (not h or (m >= 256 and (bm, bn, w, st) in _HYBRID))])


def smem_bytes(cfg: TileConfig) -> int:
    """The ring, its barriers and (K split) the [BN, BM] int32 hand-over."""
    hand_over = 4 * cfg.bm * cfg.bn if cfg.kwarps == 2 else 0
    return cfg.stages * (cfg.bm * cfg.bk + cfg.bn * cfg.bk // 2 + 32 * cfg.bn) + 1024 + hand_over


def progressive_supports(store, act, cfg: TileConfig | None) -> bool:
    if cfg is None or cfg.kwarps not in (1, 2):
        return False
    rules = cfg
    if cfg.kwarps == 2:  # two 4-warp consumers over the same rows: each must fit as a one-consumer tile
        if cfg.warps != 8 or cfg.bm > 128 or cfg.stream_k:
            return False
        rules = replace(cfg, warps=4, kwarps=1)
    return (getattr(store, "row_units", None) is not None
            and int8_tile_fits(store, act, rules, smem_bytes(cfg), rows_per_warp=(16, 32), acc_regs=128,
                               bms=(64, 128, 256)))


def w4a8_progressive(x2: torch.Tensor, store: Int4Weight, act, cfg: TileConfig) -> torch.Tensor:
    """x2 [M, K] bf16/fp16 -> [M, N]: the activations quantized per token to int8 codes, then the
    kernel."""
    if not progressive_supports(store, act, cfg):
        raise ValueError(f"w4a8_progressive cannot run {cfg} with activations {act} on this store/device "
                         f"({store.out_features}x{store.in_features}, group {getattr(store, 'group_size', '?')}, "
                         f"row units: {getattr(store, 'row_units', None) is not None}); "
                         "progressive_supports() says which")
    codes, scales = quantize_act_triton(x2, act)
    return progressive_codes(codes, scales, store, cfg, x2.dtype)


def code_rows(codes: torch.Tensor, bm: int) -> torch.Tensor:
    """codes [M, K], or their rows up to a multiple of bm: from their own storage where it holds them
    (`tile_room.rows_in_storage`), else zero rows where `PAD_ABSENT_ROWS` of the last tile would be absent."""
    absent = -codes.shape[0] % bm
    return whole_tiles(codes, bm, PAD_ABSENT_ROWS >= 0 and absent >= PAD_ABSENT_ROWS)


def progressive_codes(codes: torch.Tensor, scales: torch.Tensor, store: Int4Weight, cfg: TileConfig,
                      out_dtype: torch.dtype, ablate: int = 0) -> torch.Tensor:
    """The kernel on already quantized activations: codes [M, K] int8, scales [M] fp32. ablate: timing
    experiments only (wrong results), see `_mma_partition`."""
    m, n, k = codes.shape[0], store.out_features, store.in_features
    y = torch.empty((m, n), device=codes.device, dtype=out_dtype)
    x_desc = _code_descriptor(code_rows(codes, cfg.bm), cfg.bm, cfg.bk)  # (M stays the codes' own)
    w_desc = _weight_descriptor(store, cfg.bn, cfg.bk)
    sc_desc, mn_desc = group_descriptors(store, cfg.bn)
    consumers = 2 if cfg.warps == 8 else 1
    tiles = (n // cfg.bn) * -(-m // cfg.bm)
    halves = 2 if cfg.bm > 128 else 1  # BM = 256: two token halves, each with its own counters
    per = cmax = dpt = 0
    if cfg.stream_k:
        per, programs, cmax, dpt = stream_k_launch(cfg, m, n, k, codes.device)
        grid = (programs,)
        ws = torch.empty(programs * 2 * cfg.bn * cfg.bm, device=codes.device, dtype=torch.float32)
        cnt = counters(codes.device, tiles * consumers * halves)
    else:
        grid = (n // cfg.bn, -(-m // cfg.bm), cfg.split_k)
        ws, cnt = splitk_buffers(y, cfg.split_k, m * n, tiles * consumers * halves)
    regs = cfg.maxnreg or (TWO_CONSUMER_REGS if consumers == 2 else 0)
    pdl = PROGRESSIVE_PDL and pdl_enabled(y)
    w4a8_progressive_kernel[grid](x_desc, w_desc, sc_desc, mn_desc, store.row_units, scales, y, ws, cnt, m, n, k,
                                  per, dpt,
                                  G=store.group_size, BN=cfg.bn, STAGES=cfg.stages, BLOCKS=store.layout == BLOCKS16,
                                  SPLIT_K=cfg.split_k, CONSUMERS=consumers, num_warps=cfg.warps // consumers,
                                  ABLATE=ablate, STREAM_K=bool(cfg.stream_k), CMAX=cmax, PDL=pdl,
                                  VEC_STORE=vec_store(cfg, out_dtype), KSPLIT=cfg.kwarps == 2,
                                  **({"maxnreg": regs} if regs else {}), **launch_kwargs(pdl))
    return y


def w4a8_progressive_emulate(codes: torch.Tensor, scales: torch.Tensor, store: Int4Weight, out_dtype: torch.dtype,
                             split_k: int = 1, cfg: TileConfig | None = None) -> torch.Tensor:
    """The kernel's numerics in torch: exact int32 sums over each K slice, float(sum) * unit (exact),
    times the token scale in fp32, the slices added in order. A stream-K `cfg` (launched on this
    device's SMs) slices each output tile's K where its programs' runs meet."""
    g = store.group_size
    w8 = store.int8_weights().to(torch.float64)
    c = codes.to(torch.float64)
    kt = store.in_features // g
    units, xs = store.row_units.float()[:, None], scales.float().reshape(1, -1)

    def sliced(rows, toks, runs):
        acc = None
        for lo, hi in runs:
            cols = slice(lo * g, hi * g)
            part = (w8[rows, cols] @ c[toks, cols].t()).float()  # exact integers, then one rounding to fp32
            part = part * units[rows] * xs[:, toks]
            acc = part if acc is None else acc + part
        return acc

    if cfg is None or not cfg.stream_k:
        per = -(-kt // split_k)
        runs = [(sl * per, min(kt, (sl + 1) * per)) for sl in range(split_k)]
        return sliced(slice(None), slice(None), runs).t().to(out_dtype)
    m, n = codes.shape[0], store.out_features
    per, programs, _, dpt = stream_k_launch(cfg, m, n, store.in_features, codes.device)
    out = torch.empty(n, m, dtype=torch.float32, device=codes.device)
    mt = -(-m // cfg.bm)
    for t in range(mt * (n // cfg.bn)):  # token tiles fastest, as the kernel numbers them
        rows = slice((t // mt) * cfg.bn, (t // mt + 1) * cfg.bn)
        toks = slice((t % mt) * cfg.bm, min(m, (t % mt + 1) * cfg.bm))
        out[rows, toks] = sliced(rows, toks, stream_k_runs(t, kt, per, programs * dpt))
    return out.t().to(out_dtype)
