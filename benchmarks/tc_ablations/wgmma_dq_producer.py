"""W4A16 at large M with the dequantization in a partition of its own (GPU; stop 40).

`w4a16_wgmma`'s consumers dequantize their rows into registers and must retire each register-A
wgmma before the next dequant (ptxas 12.8 and 12.9 serialize a pipelined register-A wgmma in these
tiles; stop 26, stop 40). Here a 4-warp dequant partition writes each K tile's bf16 weights into a
second shared-memory ring, and the two consumer warpgroups only issue wgmmas with both operands in
shared memory, one left in flight (as a dense GEMM does: a dense Triton GEMM reaches cuBLAS at
1024-4096 tokens on this GPU, `bf16_gemm_ceiling.py`). The price: the bf16 tile's store and the
wgmma's A reads add shared-memory traffic a register-A kernel does not have.

Partitions of the first form (`dq_kernel`): a producer warpgroup (the TMA loads of activations and
weight bytes, the scales straight into registers, the dequantization, the stores into `a_bufs`) and two
consumers of 64 weight rows each. Ring slot s is free once the producer has read its bytes and both
consumers' wgmmas that read its activations have retired (`empty` counts 3 arrivals). A separate load
warp would make four warpgroups, whose 128-register launch cap is below the 154 that the consumers'
accumulators need (ptxas C7602).

Per Llama-3-8B shape and M: cuBLAS bf16 on a dense copy, the shipped map's W4A16 choice, the same
256 x 128 tile in `w4a16_wgmma` (two register-A consumers) and this kernel (checked against the
register-A kernel's output first: same arithmetic per weight, so equal up to summation order).

Stop 40 (H100, `results/wgmma_dq_producer_stop40_run*_*.json`, `results/large_m_w4a16_stop40.md`):
- Every form gives the register-A kernel's bits.
- First form (`dq_kernel`, the producer also issuing every TMA): 1.12x-1.20x the register-A tile's time.
  The wgmmas alone run at cuBLAS's pace; the one producer warpgroup holds them back, and a second one
  does not fit beside m64n256 accumulators.
- Last form (`dq_split_kernel` with pair slots, `split2_x3b8a4`: int32 words through a 19-instruction
  PTX block, a byte ring of the producer's own, activations refilled by the first consumer): 0.90x-1.02x
  the same register-A tile's time, but 1.05x-1.16x behind the shipped map's BK = 128 / split-K / PDL
  tiles.
- Not kept.

    PYTHONPATH=. python benchmarks/tc_ablations/wgmma_dq_producer.py --fmt int4p --shapes gate_up,down \
        --m 1024,4096 --variants split2_x3b8a4,abl2_s4a2 --out $OUT
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                             warpgroup_mma_wait)

import gearshift.kernels.w4a16_wgmma as W
from gearshift.dispatch.dispatcher import AdaptiveDispatcher
from gearshift.dispatch.profiler import PRESETS, random_store, time_us
from gearshift.kernels.config import TileConfig
from gearshift.kernels.w4a8_progressive import as_words
from gearshift.quant.int4 import BLOCKS16

SHAPES = {name: (n, k) for name, n, k in PRESETS["llama3-8b"]["shapes"]}


@gluon.constexpr_function
def producer_layout(BN, BKH, warps, vec):
    """Register layout of the producer's byte tile [BN, BK/2]: the wgmma A fragment's (`byte_layout`:
    one byte load per byte) or, with `vec`, 16 contiguous bytes per thread (one 16-byte load; its
    32 weights leave as contiguous 16-byte stores). The producer's tile goes to shared memory, so
    any layout will do."""
    if vec:
        return gl.BlockedLayout([1, 16], [16, 2], [warps, 1], [1, 0])
    return W.byte_layout(BN, BKH, warps)


#: one int4 word (8 weights, columns 0..7 in nibbles 0..7) -> four bf16 pairs in memory order, packed
#: math (exact where `packed_dequant` holds): the nibble pairs (0, 4), (1, 5), (2, 6), (3, 7) land in the
#: mantissas of a pair of 128.0 with a shift and a LOP3 each, a packed subtract leaves q, a packed FMA
#: rounds q * s + m once, and PRMTs regroup the halves into (0, 1), (2, 3), (4, 5), (6, 7): 19
#: instructions per 8 weights, no byte extraction
_WORD_BF16 = gl.constexpr(
    "{ .reg .b32 a, b, c, d, t, k; mov.b32 k, 0x43004300; "
    "lop3.b32 a, $4, 0x000F000F, k, 0xEA; shr.b32 t, $4, 4; lop3.b32 b, t, 0x000F000F, k, 0xEA; "
    "shr.b32 t, $4, 8; lop3.b32 c, t, 0x000F000F, k, 0xEA; shr.b32 t, $4, 12; lop3.b32 d, t, 0x000F000F, k, 0xEA; "
    "sub.rn.bf16x2 a, a, k; sub.rn.bf16x2 b, b, k; sub.rn.bf16x2 c, c, k; sub.rn.bf16x2 d, d, k; "
    "fma.rn.bf16x2 a, a, $5, $6; fma.rn.bf16x2 b, b, $5, $6; fma.rn.bf16x2 c, c, $5, $6; fma.rn.bf16x2 d, d, $5, $6; "
    "prmt.b32 $0, a, b, 0x5410; prmt.b32 $1, c, d, 0x5410; prmt.b32 $2, a, b, 0x7632; prmt.b32 $3, c, d, 0x7632; }")

#: timing only (wrong results with this store layout): the same without the PRMTs, i.e. what
#: `_WORD_BF16` would cost on a store whose words hold columns (0, 2, 4, 6, 1, 3, 5, 7) in nibbles 0..7,
#: where the (i, i + 4) nibble pairs already are consecutive columns: 15 instructions per 8 weights
_WORD_BF16_INTERLEAVED = gl.constexpr(
    "{ .reg .b32 t, k; mov.b32 k, 0x43004300; "
    "lop3.b32 $0, $4, 0x000F000F, k, 0xEA; shr.b32 t, $4, 4; lop3.b32 $1, t, 0x000F000F, k, 0xEA; "
    "shr.b32 t, $4, 8; lop3.b32 $2, t, 0x000F000F, k, 0xEA; shr.b32 t, $4, 12; lop3.b32 $3, t, 0x000F000F, k, 0xEA; "
    "sub.rn.bf16x2 $0, $0, k; sub.rn.bf16x2 $1, $1, k; sub.rn.bf16x2 $2, $2, k; sub.rn.bf16x2 $3, $3, k; "
    "fma.rn.bf16x2 $0, $0, $5, $6; fma.rn.bf16x2 $1, $1, $5, $6; fma.rn.bf16x2 $2, $2, $5, $6; "
    "fma.rn.bf16x2 $3, $3, $5, $6; }")

@gluon.jit
def _as_int32(buf, rows: gl.constexpr, cols: gl.constexpr, layout: gl.constexpr):
    return as_words(buf, rows, cols, layout)


@gluon.jit
def _publish_pair(a_bufs, a_ready, a_empty, i0, p0, p1):
    """K tiles i0, i0 + 1 (bf16 pairs as int32 [BN, BK / 2]) into their buffers once free, made
    visible to the wgmmas (proxy fence), then announced."""
    AST: gl.constexpr = a_bufs.type.shape[0]
    BN: gl.constexpr = a_bufs.type.shape[1]
    BKX: gl.constexpr = a_bufs.type.shape[2]
    pl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
    j0 = i0 % AST
    mbarrier.wait(a_empty.index(j0), ((i0 // AST) & 1) ^ 1)
    _as_int32(a_bufs.index(j0), BN, BKX // 2, pl).store(p0)
    mbarrier.wait(a_empty.index(j0 + 1), ((i0 // AST) & 1) ^ 1)
    _as_int32(a_bufs.index(j0 + 1), BN, BKX // 2, pl).store(p1)
    fence_async_shared()
    W._cta_barrier()
    mbarrier.arrive(a_ready.index(j0))
    mbarrier.arrive(a_ready.index(j0 + 1))


@gluon.jit
def _word_tile(w_bufs, ready, empty, i, s2, m2, BN: gl.constexpr, BKX: gl.constexpr, wl: gl.constexpr,
               INTERLEAVED: gl.constexpr = False):
    """K tile i's bytes read as int32 words (16 bytes per thread) -> its bf16 tile as int32 pairs
    [BN, BK / 2] (memory order), its ring slot handed back at once."""
    STAGES: gl.constexpr = w_bufs.type.shape[0]
    s = i % STAGES
    mbarrier.wait(ready.index(s), (i // STAGES) & 1)
    words_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=BKX // 2, element_bitwidth=32, rank=2)
    w = _as_int32(w_bufs.index(s).reshape([BN, BKX // 2]), BN, BKX // 8, words_l).load(wl)
    mbarrier.arrive(empty.index(s))
    return _word_pairs(w, s2, m2, BN, BKX, INTERLEAVED)


@gluon.jit
def _word_pairs(w, s2, m2, BN: gl.constexpr, BKX: gl.constexpr, INTERLEAVED: gl.constexpr):
    """int32 words [BN, BK / 8] -> the bf16 tile as int32 pairs [BN, BK / 2] in memory order."""
    o0, o1, o2, o3 = _word_asm(w, s2, m2, INTERLEAVED)
    return gl.reshape(gl.join(gl.join(o0, o2), gl.join(o1, o3)), [BN, BKX // 2])


@gluon.constexpr_function
def word_layout(BKX, warps):
    """[BN, BK/8] int32 words, 4 consecutive words (16 bytes) per thread."""
    return gl.BlockedLayout([1, 4], [32 // (BKX // 32), BKX // 32], [warps, 1], [1, 0])


@gluon.constexpr_function
def scale_layout(BN, BKX, warps, vec, words):
    """Where the producer keeps its per-row scales: the rows of the layout it dequantizes in."""
    return gl.SliceLayout(1, word_layout(BKX, warps) if words else producer_layout(BN, BKX // 2, warps, vec))


@gluon.jit
def _fill(x_desc, w_desc, x_bufs, w_bufs, ready, empty, i, m0, n0, BLOCKS: gl.constexpr):
    """TMA of K tile i's activations and weight bytes into ring slot i % STAGES once it is free."""
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    BKX: gl.constexpr = x_desc.block_type.shape[1]
    s = i % STAGES
    mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(s), x_desc.block_type.nbytes + w_desc.block_type.nbytes)
    W.tma_tiles(x_desc, w_desc, x_bufs.index(s), w_bufs.index(s), ready.index(s), m0, n0, i * BKX, BLOCKS)


@gluon.jit
def _scale_rows(s_ptr, mn_ptr, n0, K, G: gl.constexpr, BN: gl.constexpr, rl: gl.constexpr):
    """Pointers to the first group's scale and min of the tile's BN rows (layout rl)."""
    rows = n0 + gl.arange(0, BN, layout=rl)
    return s_ptr + rows * (K // G), mn_ptr + rows * (K // G)


@gluon.jit
def _producer(x_desc, w_desc, x_bufs, w_bufs, ready, empty, a_bufs, a_ready, a_empty, s_ptr, mn_ptr, m0, n0, num_k,
              K, G: gl.constexpr, BN: gl.constexpr, BLOCKS: gl.constexpr, F16: gl.constexpr, WARPS: gl.constexpr,
              ABL: gl.constexpr = 0, LAG: gl.constexpr = 0, PACKED: gl.constexpr = False, VEC: gl.constexpr = False):
    """One warpgroup: the TMA loads (STAGES - 1 tiles ahead of the dequantization) and the
    dequantization of K tile i's [BN, BK] weights into a_bufs[i % AST]; its scales and mins come
    straight from global memory into registers, one tile ahead. A slot is refilled after the tile
    before it was published, so the wait for its consumers cannot wait on this partition."""
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    AST: gl.constexpr = a_bufs.type.shape[0]
    BKX: gl.constexpr = a_bufs.type.shape[2]
    bl: gl.constexpr = producer_layout(BN, BKX // 2, WARPS, VEC)
    s_rows, mn_rows = _scale_rows(s_ptr, mn_ptr, n0, K, G, BN, gl.SliceLayout(1, bl))
    AHEAD: gl.constexpr = STAGES - 1 - LAG  # LAG 1: a slot is refilled only once its tile is long retired
    for i in range(gl.minimum(AHEAD, num_k)):
        _fill(x_desc, w_desc, x_bufs, w_bufs, ready, empty, i, m0, n0, BLOCKS)
    if PACKED:
        DT: gl.constexpr = gl.float16 if F16 else gl.bfloat16
        s2 = W.pack_pair(gl.load(s_rows), DT)
        m2 = W.pack_pair(gl.load(mn_rows), DT)
    else:
        sc = gl.load(s_rows).to(gl.float32)
        c = gl.load(mn_rows).to(gl.float32) - 128.0 * sc
    for i in range(num_k):
        s = i % STAGES
        j = i % AST
        if LAG == 1:
            if i + AHEAD < num_k:
                _fill(x_desc, w_desc, x_bufs, w_bufs, ready, empty, i + AHEAD, m0, n0, BLOCKS)
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        if ABL == 0 or ABL == 3:
            b = w_bufs.index(s).reshape([BN, BKX // 2]).load(bl).to(gl.int32)
        else:  # timing only (wrong results): no byte loads
            b = gl.full([BN, BKX // 2], 0x5A, gl.int32, layout=bl)
        mbarrier.arrive(empty.index(s))  # the bytes are read (the consumers release the activations)
        g_next = (gl.minimum(i + 1, num_k - 1) * BKX) // G
        if PACKED:
            lo, hi = W.dequant_bytes_x2(b, s2[:, None], m2[:, None], F16)
            s2 = W.pack_pair(gl.load(s_rows + g_next), DT)
            m2 = W.pack_pair(gl.load(mn_rows + g_next), DT)
        else:
            lo, hi = W.dequant_bytes(b, sc[:, None], c[:, None], F16)
            sc = gl.load(s_rows + g_next).to(gl.float32)
            c = gl.load(mn_rows + g_next).to(gl.float32) - 128.0 * sc
        w = gl.reshape(gl.join(lo, hi), [BN, BKX])
        mbarrier.wait(a_empty.index(j), ((i // AST) & 1) ^ 1)
        if ABL != 2:  # ABL 2: no stores either (the consumers read whatever the buffer holds)
            a_bufs.index(j).store(w)
        fence_async_shared()
        W._cta_barrier()
        mbarrier.arrive(a_ready.index(j))
        if LAG == 0:
            if i + AHEAD < num_k:
                _fill(x_desc, w_desc, x_bufs, w_bufs, ready, empty, i + AHEAD, m0, n0, BLOCKS)


@gluon.jit
def _pair_weights(w_bufs, ready, empty, i, s2, m2, sc, c, BN: gl.constexpr, BKX: gl.constexpr, bl: gl.constexpr,
                  F16: gl.constexpr, PACKED: gl.constexpr):
    """K tile i's bytes (its ring slot handed back at once) -> its [BN, BK] weights in registers."""
    STAGES: gl.constexpr = w_bufs.type.shape[0]
    s = i % STAGES
    mbarrier.wait(ready.index(s), (i // STAGES) & 1)
    b = w_bufs.index(s).reshape([BN, BKX // 2]).load(bl).to(gl.int32)
    mbarrier.arrive(empty.index(s))
    if PACKED:
        lo, hi = W.dequant_bytes_x2(b, s2[:, None], m2[:, None], F16)
    else:
        lo, hi = W.dequant_bytes(b, sc[:, None], c[:, None], F16)
    return gl.reshape(gl.join(lo, hi), [BN, BKX])


@gluon.jit
def _producer_pair(x_desc, w_desc, x_bufs, w_bufs, ready, empty, a_bufs, a_ready, a_empty, s_ptr, mn_ptr, m0, n0,
                   num_k, K, G: gl.constexpr, BN: gl.constexpr, BLOCKS: gl.constexpr, F16: gl.constexpr,
                   WARPS: gl.constexpr, PACKED: gl.constexpr, VEC: gl.constexpr, WORDS: gl.constexpr = 0):
    """`_producer` two K tiles at a time (one quantization group: G >= 2 BK): one scale load, one
    proxy fence and one partition barrier per pair, and two independent tiles in flight."""
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    AST: gl.constexpr = a_bufs.type.shape[0]
    BKX: gl.constexpr = a_bufs.type.shape[2]
    bl: gl.constexpr = producer_layout(BN, BKX // 2, WARPS, VEC)
    s_rows, mn_rows = _scale_rows(s_ptr, mn_ptr, n0, K, G, BN, scale_layout(BN, BKX, WARPS, VEC, WORDS))
    AHEAD: gl.constexpr = STAGES - 1
    for i in range(gl.minimum(AHEAD, num_k)):
        _fill(x_desc, w_desc, x_bufs, w_bufs, ready, empty, i, m0, n0, BLOCKS)
    DT: gl.constexpr = gl.float16 if F16 else gl.bfloat16
    sv_next = gl.load(s_rows)
    mv_next = gl.load(mn_rows)
    for p in range(num_k // 2):
        i0 = 2 * p
        sv = sv_next
        mv = mv_next
        g_next = (gl.minimum(i0 + 2, num_k - 2) * BKX) // G  # the next pair's scales, loaded a pair ahead
        sv_next = gl.load(s_rows + g_next)
        mv_next = gl.load(mn_rows + g_next)
        s2 = W.pack_pair(sv, DT)
        m2 = W.pack_pair(mv, DT)
        sc = sv.to(gl.float32)
        c = mv.to(gl.float32) - 128.0 * sc
        if WORDS:  # int32 words in, bf16 pairs out, both through int32 views of the shared tiles
            wl: gl.constexpr = word_layout(BKX, WARPS)
            p0 = _word_tile(w_bufs, ready, empty, i0, s2[:, None], m2[:, None], BN, BKX, wl, WORDS == 2)
            p1 = _word_tile(w_bufs, ready, empty, i0 + 1, s2[:, None], m2[:, None], BN, BKX, wl, WORDS == 2)
            _publish_pair(a_bufs, a_ready, a_empty, i0, p0, p1)
        else:
            j0 = i0 % AST
            w0 = _pair_weights(w_bufs, ready, empty, i0, s2, m2, sc, c, BN, BKX, bl, F16, PACKED)
            w1 = _pair_weights(w_bufs, ready, empty, i0 + 1, s2, m2, sc, c, BN, BKX, bl, F16, PACKED)
            mbarrier.wait(a_empty.index(j0), ((i0 // AST) & 1) ^ 1)
            a_bufs.index(j0).store(w0)
            mbarrier.wait(a_empty.index(j0 + 1), ((i0 // AST) & 1) ^ 1)
            a_bufs.index(j0 + 1).store(w1)
            fence_async_shared()
            W._cta_barrier()
            mbarrier.arrive(a_ready.index(j0))
            mbarrier.arrive(a_ready.index(j0 + 1))
        if i0 + AHEAD < num_k:
            _fill(x_desc, w_desc, x_bufs, w_bufs, ready, empty, i0 + AHEAD, m0, n0, BLOCKS)
        if i0 + 1 + AHEAD < num_k:
            _fill(x_desc, w_desc, x_bufs, w_bufs, ready, empty, i0 + 1 + AHEAD, m0, n0, BLOCKS)


@gluon.jit
def _ss_step(x_bufs, a_bufs, ready, a_ready, acc, i, ROW0: gl.constexpr, BNC: gl.constexpr, ABL: gl.constexpr = 0):
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    AST: gl.constexpr = a_bufs.type.shape[0]
    mbarrier.wait(ready.index(i % STAGES), (i // STAGES) & 1)
    mbarrier.wait(a_ready.index(i % AST), (i // AST) & 1)
    if ABL == 3:  # timing only: no wgmma (the producer's own pace)
        return acc
    acc = warpgroup_mma(a_bufs.index(i % AST).slice(ROW0, BNC), x_bufs.index(i % STAGES).permute((1, 0)), acc,
                        is_async=True)
    return warpgroup_mma_wait(1, deps=(acc,))


@gluon.jit
def _consumer_tail(acc, x_empty, a_empty, num_k, mma: gl.constexpr, y_ptr, m0, n0, M, N, WARPS: gl.constexpr,
                   VEC: gl.constexpr):
    """After a consumer's loop: retire the last wgmma, release the last tile's slots, store the rows."""
    XST: gl.constexpr = x_empty.type.shape[0]
    AST: gl.constexpr = a_empty.type.shape[0]
    acc = warpgroup_mma_wait(0, deps=(acc,))
    mbarrier.arrive(x_empty.index((num_k - 1) % XST))
    mbarrier.arrive(a_empty.index((num_k - 1) % AST))
    W.store_final(acc.to(y_ptr.dtype.element_ty), mma, y_ptr, m0, n0, M, N, WARPS, VEC)


@gluon.jit
def _ss_consumer(x_bufs, a_bufs, ready, empty, a_ready, a_empty, y_ptr, m0, n0, M, N, num_k, ROW0: gl.constexpr,
                 BNC: gl.constexpr, WARPS: gl.constexpr, VEC: gl.constexpr, ABL: gl.constexpr = 0):
    """Rows [ROW0, ROW0 + BNC) of the tile: shared-memory wgmmas, one in flight; tile i - 1's
    slots are released once tile i's wgmma is issued and i - 1's retired. Tile 0 runs before the
    loop (a loop that may run zero times zeroes the accumulator on its skip path, and ptxas then
    serializes the wgmmas: `w4a16_wgmma._a_smem_step`)."""
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    AST: gl.constexpr = a_bufs.type.shape[0]
    BM: gl.constexpr = x_bufs.type.shape[1]
    mma: gl.constexpr = W.acc_layout(BM, WARPS)
    acc = gl.zeros([BNC, BM], gl.float32, layout=mma)
    acc = _ss_step(x_bufs, a_bufs, ready, a_ready, acc, 0, ROW0, BNC, ABL)
    for i in range(1, num_k):
        acc = _ss_step(x_bufs, a_bufs, ready, a_ready, acc, i, ROW0, BNC, ABL)
        mbarrier.arrive(empty.index((i - 1) % STAGES))
        mbarrier.arrive(a_empty.index((i - 1) % AST))
    _consumer_tail(acc, empty, a_empty, num_k, mma, y_ptr, m0, n0 + ROW0, M, N, WARPS, VEC)


@gluon.jit
def dq_kernel(x_desc, w_desc, s_ptr, mn_ptr, y_ptr, M, N, K, G: gl.constexpr, BN: gl.constexpr,
              STAGES: gl.constexpr, AST: gl.constexpr, BLOCKS: gl.constexpr, F16: gl.constexpr,
              C_REGS: gl.constexpr, num_warps: gl.constexpr, ABL: gl.constexpr = 0, LAG: gl.constexpr = 0,
              PACKED: gl.constexpr = False, VEC: gl.constexpr = False, PAIR: gl.constexpr = False,
              WORDS: gl.constexpr = 0):
    BM: gl.constexpr = x_desc.block_type.shape[0]
    BKX: gl.constexpr = x_desc.block_type.shape[1]
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    a_bufs = gl.allocate_shared_memory(x_desc.dtype, [AST, BN, BKX],
                                       gl.NVMMASharedLayout.get_default_for([BN, BKX], x_desc.dtype))
    ready, empty = W.ring_barriers(STAGES, 1, 3)  # empty: the producer (bytes) and both consumers
    a_ready, a_empty = W.ring_barriers(AST, 1, 2)
    m0 = gl.program_id(1) * BM
    n0 = gl.program_id(0) * BN
    num_k = K // BKX
    half: gl.constexpr = BN // 2
    if PAIR:
        gl.warp_specialize([
            (_producer_pair, (x_desc, w_desc, x_bufs, w_bufs, ready, empty, a_bufs, a_ready, a_empty, s_ptr, mn_ptr,
                              m0, n0, num_k, K, G, BN, BLOCKS, F16, num_warps, PACKED, VEC, WORDS)),
            (_ss_consumer, (x_bufs, a_bufs, ready, empty, a_ready, a_empty, y_ptr, m0, n0, M, N, num_k, 0, half,
                            4, True, ABL)),
            (_ss_consumer, (x_bufs, a_bufs, ready, empty, a_ready, a_empty, y_ptr, m0, n0, M, N, num_k, half, half,
                            4, True, ABL)),
        ], [4, 4], [C_REGS, C_REGS])
    else:
        gl.warp_specialize([
            (_producer, (x_desc, w_desc, x_bufs, w_bufs, ready, empty, a_bufs, a_ready, a_empty, s_ptr, mn_ptr, m0,
                         n0, num_k, K, G, BN, BLOCKS, F16, num_warps, ABL, LAG, PACKED, VEC)),
            (_ss_consumer, (x_bufs, a_bufs, ready, empty, a_ready, a_empty, y_ptr, m0, n0, M, N, num_k, 0, half,
                            4, True, ABL)),
            (_ss_consumer, (x_bufs, a_bufs, ready, empty, a_ready, a_empty, y_ptr, m0, n0, M, N, num_k, half, half,
                            4, True, ABL)),
        ], [4, 4], [C_REGS, C_REGS])


def dq_w4a16(x2, store, bm=256, bn=128, bk=64, stages=4, ast=2, maxnreg=168, c_regs=200, abl=0, lag=0, packed=False, vec=False,
             pair=False, words=False):
    m, n, k = x2.shape[0], store.out_features, store.in_features
    if words and not (pair and x2.dtype == torch.bfloat16 and W.packed_dequant(store, x2.dtype)):
        raise ValueError("the word dequantization runs in the pair producer, on bf16 where packed math is exact")
    if pair and (ast < 4 or ast % 2 or store.group_size % (2 * bk)):
        # with two buffers the pair's second waits for the first's consumers, which wait for the pair
        raise ValueError("pairs need at least 4 (an even number of) A buffers and two K tiles per group")
    y = torch.empty((m, n), device=x2.device, dtype=x2.dtype)
    x_desc, w_desc = W._descriptors(x2, store, bm, bn, bk)
    grid = (n // bn, -(-m // bm))
    dq_kernel[grid](x_desc, w_desc, store.scales, store.mins, y, m, n, k, G=store.group_size, BN=bn, STAGES=stages,
                    AST=ast, BLOCKS=store.layout == BLOCKS16, F16=x2.dtype == torch.float16,
                    C_REGS=c_regs, ABL=abl, LAG=lag, PACKED=packed and W.packed_dequant(store, x2.dtype), VEC=vec, PAIR=pair, WORDS=int(words), num_warps=4,
                    maxnreg=maxnreg)
    return y

# ---- split rings (stop 40, last variant): the producer fills its own byte ring and never waits on
# the consumers for it; the first consumer fills the activation ring as the consumers free it

@gluon.jit
def _fill_bytes(x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, t, n0, BLOCKS: gl.constexpr):
    BST: gl.constexpr = w_bufs.type.shape[0]
    BKX: gl.constexpr = x_desc.block_type.shape[1]
    s = t % BST
    mbarrier.wait(b_empty.index(s), ((t // BST) & 1) ^ 1)
    mbarrier.expect(b_ready.index(s), w_desc.block_type.nbytes)
    W.tma_tiles(x_desc, w_desc, x_bufs.index(0), w_bufs.index(s), b_ready.index(s), 0, n0, t * BKX, BLOCKS,
                LOAD_X=False)


@gluon.jit
def _fill_x(x_desc, x_bufs, x_ready, x_empty, t, m0):
    XST: gl.constexpr = x_bufs.type.shape[0]
    BKX: gl.constexpr = x_desc.block_type.shape[1]
    s = t % XST
    mbarrier.wait(x_empty.index(s), ((t // XST) & 1) ^ 1)
    mbarrier.expect(x_ready.index(s), x_desc.block_type.nbytes)
    W._tma_load(x_desc, [m0, t * BKX], x_ready.index(s), x_bufs.index(s))


@gluon.jit
def _producer_split(x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, a_bufs, a_ready, a_empty, s_ptr, mn_ptr, n0,
                    num_k, K, G: gl.constexpr, BN: gl.constexpr, BLOCKS: gl.constexpr, F16: gl.constexpr,
                    WARPS: gl.constexpr, INTERLEAVED: gl.constexpr):
    """`_producer_pair`'s word dequantization on a byte ring of its own: a slot is refilled right
    after this partition read it, so only the bf16 buffers' release ties it to the consumers."""
    BST: gl.constexpr = w_bufs.type.shape[0]
    BKX: gl.constexpr = a_bufs.type.shape[2]
    wl: gl.constexpr = word_layout(BKX, WARPS)
    s_rows, mn_rows = _scale_rows(s_ptr, mn_ptr, n0, K, G, BN, gl.SliceLayout(1, wl))
    for t in range(gl.minimum(BST - 1, num_k)):
        _fill_bytes(x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, t, n0, BLOCKS)
    DT: gl.constexpr = gl.float16 if F16 else gl.bfloat16
    sv_next = gl.load(s_rows)
    mv_next = gl.load(mn_rows)
    for p in range(num_k // 2):
        i0 = 2 * p
        s2 = W.pack_pair(sv_next, DT)[:, None]
        m2 = W.pack_pair(mv_next, DT)[:, None]
        g_next = (gl.minimum(i0 + 2, num_k - 2) * BKX) // G
        sv_next = gl.load(s_rows + g_next)
        mv_next = gl.load(mn_rows + g_next)
        p0 = _word_tile(w_bufs, b_ready, b_empty, i0, s2, m2, BN, BKX, wl, INTERLEAVED)
        if i0 + BST - 1 < num_k:
            _fill_bytes(x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, i0 + BST - 1, n0, BLOCKS)
        p1 = _word_tile(w_bufs, b_ready, b_empty, i0 + 1, s2, m2, BN, BKX, wl, INTERLEAVED)
        if i0 + BST < num_k:
            _fill_bytes(x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, i0 + BST, n0, BLOCKS)
        _publish_pair(a_bufs, a_ready, a_empty, i0, p0, p1)


@gluon.jit
def _word_asm(w, s2, m2, INTERLEAVED: gl.constexpr):
    if INTERLEAVED:
        return gl.inline_asm_elementwise(_WORD_BF16_INTERLEAVED, "=r,=r,=r,=r,r,r,r", [w, s2, m2],
                                         dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1)
    else:
        return gl.inline_asm_elementwise(_WORD_BF16, "=r,=r,=r,=r,r,r,r", [w, s2, m2],
                                         dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1)


@gluon.jit
def _fill_byte_pair(x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, q, n0, BLOCKS: gl.constexpr):
    """K tiles 2q and 2q + 1's bytes into pair slot q % BSTP (two TMA boxes, one barrier)."""
    BSTP: gl.constexpr = b_ready.type.shape[0]
    BKX: gl.constexpr = x_desc.block_type.shape[1]
    s = q % BSTP
    mbarrier.wait(b_empty.index(s), ((q // BSTP) & 1) ^ 1)
    mbarrier.expect(b_ready.index(s), 2 * w_desc.block_type.nbytes)
    W.tma_tiles(x_desc, w_desc, x_bufs.index(0), w_bufs.index(2 * s), b_ready.index(s), 0, n0, 2 * q * BKX, BLOCKS,
                LOAD_X=False)
    W.tma_tiles(x_desc, w_desc, x_bufs.index(0), w_bufs.index(2 * s + 1), b_ready.index(s), 0, n0, (2 * q + 1) * BKX,
                BLOCKS, LOAD_X=False)


@gluon.jit
def _pair_words(w_bufs, b_ready, b_empty, q, s2, m2, BN: gl.constexpr, BKX: gl.constexpr, wl: gl.constexpr,
                INTERLEAVED: gl.constexpr):
    """Both K tiles of pair q -> their bf16 tiles as int32 pairs; one wait and one release."""
    w0, w1 = _load_pair(w_bufs, b_ready, b_empty, q, BN, BKX, wl)
    return _word_pairs(w0, s2, m2, BN, BKX, INTERLEAVED), _word_pairs(w1, s2, m2, BN, BKX, INTERLEAVED)


@gluon.jit
def _pair_ring_start(x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, s_ptr, mn_ptr, n0, num_k, K, G: gl.constexpr,
                     BN: gl.constexpr, BLOCKS: gl.constexpr, rl: gl.constexpr):
    """The start of a producer on pair slots: its scale rows (`_scale_rows`), the number of K-tile
    pairs, and the first BSTP - 1 pair slots of its byte ring asked for."""
    BSTP: gl.constexpr = b_ready.type.shape[0]
    s_rows, mn_rows = _scale_rows(s_ptr, mn_ptr, n0, K, G, BN, rl)
    pairs = num_k // 2
    for q in range(gl.minimum(BSTP - 1, pairs)):
        _fill_byte_pair(x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, q, n0, BLOCKS)
    return s_rows, mn_rows, pairs


@gluon.jit
def _producer_split2(x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, a_bufs, a_ready, a_empty, s_ptr, mn_ptr, n0,
                     num_k, K, G: gl.constexpr, BN: gl.constexpr, BLOCKS: gl.constexpr, F16: gl.constexpr,
                     WARPS: gl.constexpr, INTERLEAVED: gl.constexpr):
    """`_producer_split` with the byte ring in pair slots: one fill, one wait and one release per two
    K tiles."""
    BSTP: gl.constexpr = b_ready.type.shape[0]
    BKX: gl.constexpr = a_bufs.type.shape[2]
    wl: gl.constexpr = word_layout(BKX, WARPS)
    s_rows, mn_rows, pairs = _pair_ring_start(x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, s_ptr, mn_ptr, n0,
                                              num_k, K, G, BN, BLOCKS, gl.SliceLayout(1, wl))
    DT: gl.constexpr = gl.float16 if F16 else gl.bfloat16
    sv_next = gl.load(s_rows)
    mv_next = gl.load(mn_rows)
    for q in range(pairs):
        i0 = 2 * q
        s2 = W.pack_pair(sv_next, DT)[:, None]
        m2 = W.pack_pair(mv_next, DT)[:, None]
        g_next = (gl.minimum(i0 + 2, num_k - 2) * BKX) // G
        sv_next = gl.load(s_rows + g_next)
        mv_next = gl.load(mn_rows + g_next)
        p0, p1 = _pair_words(w_bufs, b_ready, b_empty, q, s2, m2, BN, BKX, wl, INTERLEAVED)
        if q + BSTP - 1 < pairs:
            _fill_byte_pair(x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, q + BSTP - 1, n0, BLOCKS)
        _publish_pair(a_bufs, a_ready, a_empty, i0, p0, p1)


@gluon.jit
def _load_pair(w_bufs, b_ready, b_empty, q, BN: gl.constexpr, BKX: gl.constexpr, wl: gl.constexpr):
    """Pair q's raw words (its slot handed back at once)."""
    BSTP: gl.constexpr = b_ready.type.shape[0]
    s = q % BSTP
    mbarrier.wait(b_ready.index(s), (q // BSTP) & 1)
    words_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=BKX // 2, element_bitwidth=32, rank=2)
    w0 = _as_int32(w_bufs.index(2 * s).reshape([BN, BKX // 2]), BN, BKX // 8, words_l).load(wl)
    w1 = _as_int32(w_bufs.index(2 * s + 1).reshape([BN, BKX // 2]), BN, BKX // 8, words_l).load(wl)
    mbarrier.arrive(b_empty.index(s))
    return w0, w1


@gluon.jit
def _producer_split3(x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, a_bufs, a_ready, a_empty, s_ptr, mn_ptr, n0,
                     num_k, K, G: gl.constexpr, BN: gl.constexpr, BLOCKS: gl.constexpr, F16: gl.constexpr,
                     WARPS: gl.constexpr, INTERLEAVED: gl.constexpr):
    """`_producer_split2` software-pipelined: pair q + 1's words are loaded (and its byte slot
    refilled) before pair q is converted and published, so its shared-memory and barrier latency
    overlaps pair q's arithmetic. Measured 1.06x-1.13x slower than `_producer_split2` (stop 40,
    `results/wgmma_dq_producer_stop40_run12_*`): the extra live words cost the 104-register producer
    more than the overlap gains (ptxas spills 8 bytes)."""
    BSTP: gl.constexpr = b_ready.type.shape[0]
    BKX: gl.constexpr = a_bufs.type.shape[2]
    wl: gl.constexpr = word_layout(BKX, WARPS)
    s_rows, mn_rows, pairs = _pair_ring_start(x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, s_ptr, mn_ptr, n0,
                                              num_k, K, G, BN, BLOCKS, gl.SliceLayout(1, wl))
    DT: gl.constexpr = gl.float16 if F16 else gl.bfloat16
    sv = gl.load(s_rows)
    mv = gl.load(mn_rows)
    w0, w1 = _load_pair(w_bufs, b_ready, b_empty, 0, BN, BKX, wl)
    if BSTP - 1 < pairs:
        _fill_byte_pair(x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, BSTP - 1, n0, BLOCKS)
    for q in range(pairs):
        i0 = 2 * q
        s2 = W.pack_pair(sv, DT)[:, None]
        m2 = W.pack_pair(mv, DT)[:, None]
        qn = gl.minimum(q + 1, pairs - 1)  # the last pass loads its own pair's scales again (unused)
        sv = gl.load(s_rows + (2 * qn * BKX) // G)
        mv = gl.load(mn_rows + (2 * qn * BKX) // G)
        if q + 1 < pairs:
            n0w, n1w = _load_pair(w_bufs, b_ready, b_empty, q + 1, BN, BKX, wl)
            if q + BSTP < pairs:
                _fill_byte_pair(x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, q + BSTP, n0, BLOCKS)
        else:
            n0w = w0
            n1w = w1
        _publish_pair(a_bufs, a_ready, a_empty, i0, _word_pairs(w0, s2, m2, BN, BKX, INTERLEAVED),
                      _word_pairs(w1, s2, m2, BN, BKX, INTERLEAVED))
        w0 = n0w
        w1 = n1w


@gluon.jit
def _split_consumer(x_desc, x_bufs, a_bufs, x_ready, x_empty, a_ready, a_empty, y_ptr, m0, n0, M, N, num_k,
                    ROW0: gl.constexpr, BNC: gl.constexpr, WARPS: gl.constexpr):
    """`_ss_consumer` on the split rings; the rows-0 consumer also refills the activation slot the
    two consumers free (it waits for the other's release, then issues the TMA)."""
    XST: gl.constexpr = x_bufs.type.shape[0]
    AST: gl.constexpr = a_bufs.type.shape[0]
    BM: gl.constexpr = x_bufs.type.shape[1]
    FILLS: gl.constexpr = ROW0 == 0
    mma: gl.constexpr = W.acc_layout(BM, WARPS)
    if FILLS:  # every slot is free at first; the loop refills slot (i - 1) % XST with tile i - 1 + XST
        for t in range(gl.minimum(XST, num_k)):
            _fill_x(x_desc, x_bufs, x_ready, x_empty, t, m0)
    acc = gl.zeros([BNC, BM], gl.float32, layout=mma)
    acc = _ss_step(x_bufs, a_bufs, x_ready, a_ready, acc, 0, ROW0, BNC)
    for i in range(1, num_k):
        acc = _ss_step(x_bufs, a_bufs, x_ready, a_ready, acc, i, ROW0, BNC)
        mbarrier.arrive(x_empty.index((i - 1) % XST))
        mbarrier.arrive(a_empty.index((i - 1) % AST))
        if FILLS:
            if i - 1 + XST < num_k:
                _fill_x(x_desc, x_bufs, x_ready, x_empty, i - 1 + XST, m0)
    _consumer_tail(acc, x_empty, a_empty, num_k, mma, y_ptr, m0, n0 + ROW0, M, N, WARPS, True)


@gluon.jit
def dq_split_kernel(x_desc, w_desc, s_ptr, mn_ptr, y_ptr, M, N, K, G: gl.constexpr, BN: gl.constexpr,
                    XST: gl.constexpr, BST: gl.constexpr, AST: gl.constexpr, BLOCKS: gl.constexpr,
                    F16: gl.constexpr, C_REGS: gl.constexpr, INTERLEAVED: gl.constexpr, num_warps: gl.constexpr,
                    PAIRSLOTS: gl.constexpr = 0):
    BM: gl.constexpr = x_desc.block_type.shape[0]
    BKX: gl.constexpr = x_desc.block_type.shape[1]
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [XST] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [BST] + w_desc.block_type.shape, w_desc.layout)
    a_bufs = gl.allocate_shared_memory(x_desc.dtype, [AST, BN, BKX],
                                       gl.NVMMASharedLayout.get_default_for([BN, BKX], x_desc.dtype))
    x_ready, x_empty = W.ring_barriers(XST, 1, 2)
    b_ready, b_empty = W.ring_barriers(BST // 2 if PAIRSLOTS > 0 else BST, 1, 1)
    a_ready, a_empty = W.ring_barriers(AST, 1, 2)
    m0 = gl.program_id(1) * BM
    n0 = gl.program_id(0) * BN
    num_k = K // BKX
    half: gl.constexpr = BN // 2
    if PAIRSLOTS == 2:
        gl.warp_specialize([
            (_producer_split3, (x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, a_bufs, a_ready, a_empty, s_ptr, mn_ptr, n0,
                                 num_k, K, G, BN, BLOCKS, F16, num_warps, INTERLEAVED)),
            (_split_consumer, (x_desc, x_bufs, a_bufs, x_ready, x_empty, a_ready, a_empty, y_ptr, m0, n0, M, N, num_k,
                               0, half, 4)),
            (_split_consumer, (x_desc, x_bufs, a_bufs, x_ready, x_empty, a_ready, a_empty, y_ptr, m0, n0, M, N, num_k,
                               half, half, 4)),
        ], [4, 4], [C_REGS, C_REGS])
    elif PAIRSLOTS:
        gl.warp_specialize([
            (_producer_split2, (x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, a_bufs, a_ready, a_empty, s_ptr, mn_ptr, n0,
                                 num_k, K, G, BN, BLOCKS, F16, num_warps, INTERLEAVED)),
            (_split_consumer, (x_desc, x_bufs, a_bufs, x_ready, x_empty, a_ready, a_empty, y_ptr, m0, n0, M, N, num_k,
                               0, half, 4)),
            (_split_consumer, (x_desc, x_bufs, a_bufs, x_ready, x_empty, a_ready, a_empty, y_ptr, m0, n0, M, N, num_k,
                               half, half, 4)),
        ], [4, 4], [C_REGS, C_REGS])
    else:
        gl.warp_specialize([
            (_producer_split, (x_desc, w_desc, x_bufs, w_bufs, b_ready, b_empty, a_bufs, a_ready, a_empty, s_ptr, mn_ptr, n0,
                                num_k, K, G, BN, BLOCKS, F16, num_warps, INTERLEAVED)),
            (_split_consumer, (x_desc, x_bufs, a_bufs, x_ready, x_empty, a_ready, a_empty, y_ptr, m0, n0, M, N, num_k,
                               0, half, 4)),
            (_split_consumer, (x_desc, x_bufs, a_bufs, x_ready, x_empty, a_ready, a_empty, y_ptr, m0, n0, M, N, num_k,
                               half, half, 4)),
        ], [4, 4], [C_REGS, C_REGS])


def dq_split_w4a16(x2, store, xst=3, bst=8, ast=4, interleaved=False, bm=256, bn=128, bk=64, c_regs=200,
                   pairslots=False):
    """`dq_split_kernel` (bf16, stores where packed dequantization is exact, two K tiles per group)."""
    m, n, k = x2.shape[0], store.out_features, store.in_features
    if not (x2.dtype == torch.bfloat16 and W.packed_dequant(store, x2.dtype)) or store.group_size % (2 * bk):
        raise ValueError("the split-ring kernel runs bf16 on stores where packed dequantization is exact")
    if ast < 4 or ast % 2:
        raise ValueError("pairs need at least 4 (an even number of) bf16 buffers")
    y = torch.empty((m, n), device=x2.device, dtype=x2.dtype)
    x_desc, w_desc = W._descriptors(x2, store, bm, bn, bk)
    dq_split_kernel[(n // bn, -(-m // bm))](x_desc, w_desc, store.scales, store.mins, y, m, n, k, G=store.group_size,
                                            BN=bn, XST=xst, BST=bst, AST=ast, BLOCKS=store.layout == BLOCKS16,
                                            F16=False, C_REGS=c_regs, INTERLEAVED=interleaved, num_warps=4,
                                            PAIRSLOTS=int(pairslots),
                                            maxnreg=168)
    return y



VARIANTS = {"dq_s4a2": dict(stages=4, ast=2), "dq_s3a3": dict(stages=3, ast=3), "dq_s4a3": dict(stages=4, ast=3),
            "dq_s5a2": dict(stages=5, ast=2),
            # timing only, wrong results: no byte loads (abl 1); no byte loads and no bf16 tile stores (abl 2)
            "abl1_s4a2": dict(stages=4, ast=2, abl=1), "abl2_s4a2": dict(stages=4, ast=2, abl=2),
            # a slot refilled one tile later, so the producer never waits on the consumers' retire
            "lag_s4a2": dict(stages=4, ast=2, lag=1), "lag_s5a2": dict(stages=5, ast=2, lag=1),
            "lag_s4a3": dict(stages=4, ast=3, lag=1),
            # packed 16-bit dequantization (where exact: int4-prog stores with bf16, `packed_dequant`)
            "lagp_s4a2": dict(stages=4, ast=2, lag=1, packed=True), "lagp_s5a2": dict(stages=5, ast=2, lag=1, packed=True),
            # 16-byte loads and stores in the producer
            "vec_s4a2": dict(stages=4, ast=2, vec=True), "vecp_s4a2": dict(stages=4, ast=2, vec=True, packed=True),
            "vecp_s4a3": dict(stages=4, ast=3, vec=True, packed=True), "vecp_s5a2": dict(stages=5, ast=2, vec=True, packed=True),
            "vecp_s3a3": dict(stages=3, ast=3, vec=True, packed=True),
            # two K tiles per producer step (one fence / barrier / scale load per pair)
            "pair_s4a4": dict(stages=4, ast=4, vec=True, packed=True, pair=True),
            "pair_s5a4": dict(stages=5, ast=4, vec=True, packed=True, pair=True),
            "pair_s3a4": dict(stages=3, ast=4, vec=True, packed=True, pair=True),
            "pairf_s4a4": dict(stages=4, ast=4, vec=True, pair=True),
            # int32 words in, bf16 pairs out (19 instructions per 8 weights, no byte extraction)
            "words_s4a4": dict(stages=4, ast=4, vec=True, packed=True, pair=True, words=True),
            "words_s3a4": dict(stages=3, ast=4, vec=True, packed=True, pair=True, words=True),
            # timing only (wrong results): the cost on a nibble-interleaved store, without the PRMTs
            "abl_interleaved_s4a4": dict(stages=4, ast=4, vec=True, packed=True, pair=True, words=2),
            # split rings: the producer's own byte ring, the activations refilled by the first consumer
            "split_x3b8a4": dict(split=True, xst=3, bst=8, ast=4), "split_x3b6a4": dict(split=True, xst=3, bst=6, ast=4),
            "split_x4b8a4": dict(split=True, xst=4, bst=8, ast=4),
            "abl_split_interleaved": dict(split=True, xst=3, bst=8, ast=4, interleaved=True),
            # pair slots in the byte ring (bst counts K tiles: bst / 2 pair slots)
            "split2_x3b8a4": dict(split=True, xst=3, bst=8, ast=4, pairslots=True),
            "split2_x3b6a4": dict(split=True, xst=3, bst=6, ast=4, pairslots=True),
            "abl_split2_interleaved": dict(split=True, xst=3, bst=8, ast=4, pairslots=True, interleaved=True),
            # pair slots, software-pipelined producer (the next pair's words loaded before this pair converts)
            "split3_x3b8a4": dict(split=True, xst=3, bst=8, ast=4, pairslots=2),
            "split3_x3b10a4": dict(split=True, xst=3, bst=10, ast=4, pairslots=2),
            # timing only: the consumers issue no wgmma (how fast the producer alone runs)
            "abl3_vecp_s4a2": dict(stages=4, ast=2, vec=True, packed=True, abl=3),
            "abl3_pair_s4a4": dict(stages=4, ast=4, vec=True, packed=True, pair=True, abl=3)}


def run_variant(x, store, var):
    kw = dict(VARIANTS[var])
    if kw.pop("split", False):
        return dq_split_w4a16(x, store, **kw)
    return dq_w4a16(x, store, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", default="512,1024,2048,4096")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--fmt", default="int4", choices=("int4", "int4p"))
    ap.add_argument("--out", default=".")
    ap.add_argument("--once", default=None, help="launch one variant (or 'reg': the register-A tile) twice on the "
                    "first shape and M, nothing else (for Nsight Compute: --launch-skip 1 --launch-count 1)")
    a = ap.parse_args()
    if a.once:
        n, k = SHAPES[a.shapes.split(",")[0]]
        store = random_store(a.fmt, n, k, 128, "cuda", layout="blocks16")
        x = torch.randn(int(a.m.split(",")[0]), k, device="cuda", dtype=torch.bfloat16)
        W.WGMMA_PDL = False
        for _ in range(2):
            if a.once == "reg":
                W.w4a16_wgmma(x, store, TileConfig(256, 128, 64, 1, 8, 4))
            else:
                run_variant(x, store, a.once)
        torch.cuda.synchronize()
        return
    disp = AdaptiveDispatcher()
    reg_tile = TileConfig(256, 128, 64, 1, 8, 4)  # the same tile as two register-A consumers
    rows, dev, t0 = [], torch.cuda.get_device_name(), time.time()
    for name in a.shapes.split(","):
        n, k = SHAPES[name]
        store = random_store(a.fmt, n, k, 128, "cuda", layout="blocks16")
        wd = store.dequantize(torch.bfloat16)
        for m in [int(v) for v in a.m.split(",")]:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            r = {"shape": name, "m": m, "bf16_us": time_us([lambda: x @ wd.t()]),
                 "map_us": time_us([lambda: disp.linear(x, store, None)])}
            c = disp.choose(store, None, m)
            r["map_choice"] = None if c is None else f"{c.strategy} {c.config.key() if c.config else ''}"
            y_reg = W.w4a16_wgmma(x, store, reg_tile)
            r["reg_us"] = time_us([lambda: W.w4a16_wgmma(x, store, reg_tile)])  # with PDL, as shipped
            W.WGMMA_PDL = False
            r["reg_nopdl_us"] = time_us([lambda: W.w4a16_wgmma(x, store, reg_tile)])
            W.WGMMA_PDL = True
            for var in a.variants.split(","):
                try:
                    y = run_variant(x, store, var)
                    torch.cuda.synchronize()
                    err = ((y.float() - y_reg.float()).norm() / y_reg.float().norm()).item()
                    r[f"{var}_err"] = err
                    if not err < 5e-3 and not var.startswith("abl"):
                        r[var] = f"wrong: {err:.3g}"
                        continue
                    r[var] = time_us([lambda: run_variant(x, store, var)])
                    print(f"      {name} M={m} {var}: {r[var]:.1f} us", flush=True)
                except Exception as ex:  # noqa: BLE001 - report, keep going
                    r[var] = f"error: {type(ex).__name__}: {str(ex)[:300]}"
            rows.append(r)
            best = min((v for kk, v in r.items() if kk in VARIANTS and not kk.startswith("abl") and isinstance(v, float)),
                       default=None)
            print(f"[{time.time() - t0:5.0f}s] {name:8s} M={m:5d} cuBLAS {r['bf16_us']:8.1f} map {r['map_us']:8.1f} "
                  f"reg-A 256x128 {r['reg_us']:8.1f} (no PDL {r['reg_nopdl_us']:8.1f}) dq best {best}", flush=True)
            for var in a.variants.split(","):
                print("   ", var, r[var] if isinstance(r[var], str) else round(r[var], 1))
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"wgmma_dq_producer_{dev.replace(' ', '_')}.json")
    json.dump({"device": dev, "torch": torch.__version__, "triton": triton.__version__, "rows": rows},
              open(path, "w"), indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
