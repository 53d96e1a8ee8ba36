"""W4A16 for large M on Hopper: a warp-specialized Gluon kernel (TMA + mbarriers + async wgmma).

Why: the `tl.dot` tiles (`w4a16.py`) trail cuBLAS from M = 128 on because nothing overlaps a
tile's dequantization with the previous tile's MMAs at their 1-2 programs per SM, and Triton 3.6
does not warp-specialize that loop (docs/kernels_history.md, stop 12). Here the partitions are written
out:

* a one-warp load partition streams the activation tile [BM, 64] (bf16/fp16) and the packed
  weight tile [BN, 32] (uint8, row or blocks16 layout) into a STAGES-deep shared-memory ring with
  TMA, and stores each tile's scale / min column beside them; `ready` counts both;
* one or two consumer partitions read the weight bytes straight into the registers of the wgmma
  A operand and dequantize them there (one byte -> its two weights as a packed 16-bit pair:
  (128 + q) * scale + (min - 128 scale), the nibble OR-ed into the mantissa of 128.0, one FFMA
  each, one paired convert; or, where it gives the same bits (`packed_dequant`: fp16 activations,
  or bf16 with scales and mins that are bf16 values, as in int4-prog stores), one packed 16-bit
  FMA per byte, `dequant_bytes_x2`). With A in registers each wgmma retires before the next dequant (see
  `_mma_partition`), and the overlap comes from 2-3 CTAs per SM (a register cap) or from two
  independent 4-warp consumers; with A through shared memory (`a_smem`) one wgmma stays in
  flight while the next tile is dequantized. A slot is handed back (`empty`) once the wgmma that
  read it has retired. Optional split-K uses `splitk.py`'s deterministic reduction.

Swap-AB as the other kernels: the wgmma computes y^T [BN, BM] = W [BN, 64] x^T [64, BM].
The byte tile's register layout (`byte_layout`) is chosen so that splitting each byte into its
two nibbles *is* the wgmma A-fragment layout: the compiler checks that the conversion is free
(`convert_layout(..., assert_trivial=True)`). DPR: P_W = (4), P_X = (16), Padding on bf16 MMA;
`w4a8_wgmma` runs quantized activations' codes through it (P_X = (8) padded to 16 bits).

CPU: Gluon has no interpreter; tests compile this for sm_90 and run `w4a16_wgmma_emulate`,
the torch model of its numerics. The GPU tests compare the two.
"""

from __future__ import annotations

import functools
import os
import weakref

import torch

from gearshift.kernels._triton import HAS_TRITON
from gearshift.kernels.config import TileConfig
from gearshift.kernels.pdl import launch_kwargs, pdl_enabled
from gearshift.kernels.splitk import counters, splitk_buffers
from gearshift.kernels.tile_room import whole_tiles
from gearshift.quant.int4 import BLOCKS16, Int4Weight

BK = 64  # the default K tile: 128-byte activation rows (the 128B TMA swizzle); 128 is a config too
BKS = (64, 128)

#: TMA-swizzle the weight byte tile (rows of BK/2 bytes). Unswizzled, the 8 lanes that read down a
#: column hit 2-way (BK = 64) or 4-way (BK = 128) bank conflicts; swizzled, the same tiles ran 0-10%
#: (BK = 64) and 15-29% (BK = 128) faster on the H100 (benchmarks/results/w16_swizzle_*.json)
SWIZZLE_WEIGHTS = True

#: launch with programmatic dependent launch where `kernels/pdl.py` allows it: the load warp lets
#: the next kernel in at once, requests the first ring's weights, then waits for the previous
#: kernel (benchmarks compare with False; GEARSHIFT_WGMMA_PDL=0 turns it off, GEARSHIFT_PDL=0
#: turns off PDL everywhere). Results are identical either way.
WGMMA_PDL = os.environ.get("GEARSHIFT_WGMMA_PDL", "1") not in ("0", "", "false", "False")

#: store each finished tile through a row-contiguous layout (`store_rows`: 16-byte stores of 8
#: weight rows instead of the wgmma layout's 2-byte stores; stop 27). Results are identical either
#: way; GEARSHIFT_WGMMA_VEC_STORE=0 turns it off (benchmarks compare with False).
WGMMA_VEC_STORE = os.environ.get("GEARSHIFT_WGMMA_VEC_STORE", "1") not in ("0", "", "false", "False")

HAS_GLUON = False
if HAS_TRITON:
    try:
        from triton.experimental import gluon
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                     warpgroup_mma_wait)
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        HAS_GLUON = True
    except Exception:  # pragma: no cover - depends on the Triton build
        HAS_GLUON = False

if HAS_GLUON:
    from gearshift.kernels.pdl import GDC_LAUNCH, GDC_WAIT

    # Triton 3.6 names the TMA load async_copy_global_to_shared; later releases async_load.
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    # ... and the CTA barrier thread_barrier, later barrier
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

    @gluon.constexpr_function
    def fragment_rows(BN, warps):
        """The row part of a wgmma A-fragment-shaped layout over BN rows: (register bases for the
        rows beyond 16 per warp, which repeat in registers; warp bases, warps stacking 16-row groups)."""
        reg, rows = [], 16 * warps
        while rows < BN:
            reg.append([rows, 0])
            rows *= 2
        return reg, [[16 << i, 0] for i in range(warps.bit_length() - 1)]

    @gluon.constexpr_function
    def byte_layout(BN, BKH, warps):
        """Register layout of the uint8 tile [BN, BK/2] whose nibble split is the wgmma A fragment
        (16-bit, k_width 2): lane (g, t) of a warp holds rows g and g+8 and bytes t, t+4, t+8, ...
        (weights 2t, 2t+1, 2t+8, 2t+9, ...); warps stack 16-row groups; extra rows repeat in registers."""
        extra, warp_bases = fragment_rows(BN, warps)
        reg = [[8, 0]] + [[0, 4 << i] for i in range((BKH // 4).bit_length() - 1)] + extra
        return gl.DistributedLinearLayout(
            reg_bases=reg, lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
            warp_bases=warp_bases, block_bases=[], shape=[BN, BKH])

    @gluon.constexpr_function
    def acc_layout(BM, warps):
        """The fp32 accumulator layout of a consumer's [rows, BM tokens] wgmma tile (16-bit operands)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, BM, 16])

    def _dequant_ptx(cvt: str) -> str:
        return ("{ .reg .b32 l, h, t; shl.b32 l, $2, 16; lop3.b32 l, l, 0x000F0000, 0x43000000, 0xEA; "
                "shl.b32 h, $2, 12; lop3.b32 h, h, 0x000F0000, 0x43000000, 0xEA; "
                "fma.rn.f32 l, l, $3, $4; fma.rn.f32 h, h, $3, $4; "
                f"{cvt} t, h, l; mov.b32 {{$0, $1}}, t; }}")

    _DEQUANT_BF16 = gl.constexpr(_dequant_ptx("cvt.rn.bf16x2.f32"))
    _DEQUANT_F16 = gl.constexpr(_dequant_ptx("cvt.rn.f16x2.f32"))

    def _dequant_x2_ptx(magic: int, op: str) -> str:
        return ("{ .reg .b32 x, c; mul.lo.u32 x, $2, 4097; "
                f"lop3.b32 x, x, 0x000F000F, {magic:#x}, 0xEA; mov.b32 c, {magic:#x}; sub.rn.{op} x, x, c; "
                f"fma.rn.{op} x, x, $3, $4; mov.b32 {{$0, $1}}, x; }}")

    _DEQUANT_X2_BF16 = gl.constexpr(_dequant_x2_ptx(0x43004300, "bf16x2"))
    _DEQUANT_X2_F16 = gl.constexpr(_dequant_x2_ptx(0x64006400, "f16x2"))
    _MAGIC_ONLY = gl.constexpr("{ .reg .b32 x; mul.lo.u32 x, $2, 4097; "
                               "lop3.b32 x, x, 0x000F000F, 0x43004300, 0xEA; mov.b32 {$0, $1}, x; }")
    #: timing experiments only (benchmarks/tc_ablations/dequant_cost.py), read once at import:
    #: 2 = no scaling (wrong results), 3 = no byte loads either (wrong results); 0, the default, is
    #: the kernel.
    _ABLATE = gl.constexpr(int(os.environ.get("GEARSHIFT_WGMMA_ABLATE", "0")))

    @gluon.jit
    def pack_pair(v, DT: gl.constexpr):
        """A per-row value rounded to the 16-bit type DT, twice in one int32 (a packed pair)."""
        bits = v.to(DT).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
        return bits | (bits << 16)

    @gluon.jit
    def dequant_bytes_x2(b, s2, m2, F16: gl.constexpr):
        """Code byte -> q * s + m for both nibbles in packed 16-bit math (s2, m2: `pack_pair`): one
        IMAD and one LOP3 put the nibbles into the mantissas of a pair of 128.0 (bf16; 1024.0 fp16),
        a packed subtract leaves q exactly, one packed FMA rounds q * s + m once. 4 instructions per
        byte against `dequant_bytes`' 7, and the same bits wherever s and m are exact in x's dtype
        (`packed_dequant`)."""
        return _byte_pair(_DEQUANT_X2_F16 if F16 else _DEQUANT_X2_BF16, b, s2, m2, F16)

    @gluon.jit
    def _byte_pair(asm: gl.constexpr, b, s, c, F16: gl.constexpr):
        """One PTX block per code byte with two 32-bit operands -> the byte's two 16-bit weights."""
        if F16:
            lo, hi = gl.inline_asm_elementwise(asm, "=h,=h,r,r,r", [b, s, c], dtype=(gl.float16, gl.float16),
                                               is_pure=True, pack=1)
        else:
            lo, hi = gl.inline_asm_elementwise(asm, "=h,=h,r,r,r", [b, s, c], dtype=(gl.bfloat16, gl.bfloat16),
                                               is_pure=True, pack=1)
        return lo, hi

    @gluon.jit
    def dequant_bytes(b, s, c, F16: gl.constexpr):
        """Code byte (int32, 0..255) -> its two weights (128 + q) * s + c (c = min - 128 s), low
        nibble first: each nibble lands in bits 16..19 of fp32 128.0 (one shift, one LOP3; reads
        as 128 + q exactly), one FFMA, and a paired convert rounds both once to fp16/bf16."""
        return _byte_pair(_DEQUANT_F16 if F16 else _DEQUANT_BF16, b, s, c, F16)

    @gluon.jit
    def tma_tiles(x_desc, w_desc, x_buf, w_buf, bar, m0, n0, k0, BLOCKS: gl.constexpr, LOAD_X: gl.constexpr = True,
                  LOAD_W: gl.constexpr = True):
        """The activation tile [BM, BK] at (m0, k0) and the weight bytes of rows n0.. for columns
        k0..k0+BK (row layout: [BN, BK/2]; blocks16: the [N/16, K/128 * 16, 64] view, chunk row
        (k0 / 128) * 16 + n % 16, whose [BN/16, 16, BK/2] box is the same tile). LOAD_X / LOAD_W = False
        (timing experiments only) leave the activations / the weights out."""
        if LOAD_X:
            _tma_load(x_desc, [m0, k0], bar, x_buf)
        if LOAD_W:
            if BLOCKS:
                _tma_load(w_desc, [n0 // 16, (k0 // 128) * 16, (k0 % 128) // 2], bar, w_buf)
            else:
                _tma_load(w_desc, [n0, k0 // 2], bar, w_buf)

    @gluon.jit
    def grid_wait(PDL: gl.constexpr):
        """PDL (`kernels/pdl.py`): block until the previous kernel has completed and its writes are
        visible. Nothing that kernel writes (the activations) and no store may come before this."""
        if PDL:
            gl.inline_asm_elementwise(GDC_WAIT, "=r", [], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def launch_dependents(PDL: gl.constexpr):
        """PDL: the next kernel may be scheduled once every program of this one has got here."""
        if PDL:
            gl.inline_asm_elementwise(GDC_LAUNCH, "=r", [], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _prefill_weights(x_desc, w_desc, x_bufs, w_bufs, ready, n0, t0, npre, BLOCKS: gl.constexpr):
        """PDL: the weight tiles of the first `npre` ring slots (their `ready` expects both tiles'
        bytes), loaded before `grid_wait`: weights are never written by the previous kernel."""
        BKX: gl.constexpr = x_desc.block_type.shape[1]
        for i in range(npre):
            mbarrier.expect(ready.index(i), x_desc.block_type.nbytes + w_desc.block_type.nbytes)
            tma_tiles(x_desc, w_desc, x_bufs.index(i), w_bufs.index(i), ready.index(i), 0, n0, (t0 + i) * BKX,
                      BLOCKS, LOAD_X=False)

    @gluon.jit
    def _fill_slot(x_desc, w_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, i, m0, n0, k0, sc, mn,
                   BLOCKS: gl.constexpr, PDL: gl.constexpr = False, npre=0):
        """Ring slot of the i-th tile of this program: wait until it is free, TMA the activation and
        weight tiles at (m0, n0, k0) into it and store the tile's scale / min column beside them
        (with PDL, slots below npre hold their weights already: `_prefill_weights`)."""
        STAGES: gl.constexpr = x_bufs.type.shape[0]
        s = i % STAGES
        if PDL:  # (the plain branch repeated below: a shared runtime flag costs the non-PDL kernel a warp sync)
            if i < npre:
                _tma_load(x_desc, [m0, k0], ready.index(s), x_bufs.index(s))
            else:
                mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), x_desc.block_type.nbytes + w_desc.block_type.nbytes)
                tma_tiles(x_desc, w_desc, x_bufs.index(s), w_bufs.index(s), ready.index(s), m0, n0, k0, BLOCKS)
        else:
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), x_desc.block_type.nbytes + w_desc.block_type.nbytes)
            tma_tiles(x_desc, w_desc, x_bufs.index(s), w_bufs.index(s), ready.index(s), m0, n0, k0, BLOCKS)
        sc_bufs.index(s).store(sc)
        mn_bufs.index(s).store(mn)
        mbarrier.arrive(ready.index(s))

    @gluon.jit
    def _load_partition(x_desc, w_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, s_ptr, mn_ptr, m0, n0, t0,
                        num_k, K, G: gl.constexpr, BLOCKS: gl.constexpr, PDL: gl.constexpr):
        """One warp: TMA for the activation and weight tiles, and each tile's scale / min column
        for the BN rows (plain loads one tile ahead, stored to the slot before its second arrive).
        With PDL the first ring's weights and scales are requested before `grid_wait`."""
        STAGES: gl.constexpr = x_bufs.type.shape[0]
        BKX: gl.constexpr = x_desc.block_type.shape[1]
        BN: gl.constexpr = sc_bufs.type.shape[1]
        rl: gl.constexpr = gl.BlockedLayout([BN // 32], [32], [1], [0])
        rows = n0 + gl.arange(0, BN, layout=rl)
        s_rows = s_ptr + rows * (K // G)  # each row's first group; + g below
        mn_rows = mn_ptr + rows * (K // G)
        g0 = (t0 * BKX) // G
        sc = gl.load(s_rows + g0)
        mn = gl.load(mn_rows + g0)
        npre = 0
        if PDL:
            launch_dependents(PDL)
            npre = gl.minimum(num_k, STAGES)
            _prefill_weights(x_desc, w_desc, x_bufs, w_bufs, ready, n0, t0, npre, BLOCKS)
            grid_wait(PDL)
        for i in range(num_k):
            _fill_slot(x_desc, w_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, i, m0, n0, (t0 + i) * BKX,
                       sc, mn, BLOCKS, PDL, npre)
            g_next = ((t0 + gl.minimum(i + 1, num_k - 1)) * BKX) // G
            sc = gl.load(s_rows + g_next)
            mn = gl.load(mn_rows + g_next)

    @gluon.jit
    def stream_k_segment(T, per, dpt, KT, seg):
        """Stream-K: segment `seg` of this program's (tile, K tile) iterations [start, end), over
        tiles first, first + step, .., last (none when last < first). Segment 0: whole tiles, one
        per full wave of the grid (`TileConfig.hybrid`; dpt = their iterations per program, 0:
        none), tile p of each wave so that neighbouring programs share operands in L2 as a plain
        grid's do; segment 1: its run of `per` of the iterations after all whole tiles (all of
        them when dpt = 0)."""
        p = gl.program_id(0)
        P = gl.num_programs(0)
        if seg == 0:
            start = p * 0
            end = T
            first = p
            last = p + (dpt // KT - 1) * P
            step = P
        else:
            start = P * dpt + p * per
            end = gl.minimum(start + per, T)
            first = start // KT
            last = gl.where(end > start, (end - 1) // KT, first - 1)
            step = 1
        return start, end, first, last, step

    @gluon.jit
    def stream_k_tile(t, MT, BM: gl.constexpr, BN: gl.constexpr):
        """Output tile t -> (m0, n0), token tiles fastest: neighbouring programs share a weight tile.
        (Weight tiles fastest, the data-parallel grid's order, measured 0-4% slower: stop 24.)"""
        return (t % MT) * BM, (t // MT) * BN

    @gluon.jit
    def _load_partition_sk(x_desc, w_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, s_ptr, mn_ptr, T, per,
                           dpt, KT, MT, K, G: gl.constexpr, BLOCKS: gl.constexpr, PDL: gl.constexpr):
        """The load warp of a stream-K program: the same slots, over its run of (tile, K tile)
        iterations, one output tile's K range at a time (as the consumers walk them). With PDL it
        waits for the previous kernel after its first scale loads."""
        BM: gl.constexpr = x_desc.block_type.shape[0]
        BKX: gl.constexpr = x_desc.block_type.shape[1]
        BN: gl.constexpr = sc_bufs.type.shape[1]
        rl: gl.constexpr = gl.BlockedLayout([BN // 32], [32], [1], [0])
        ar = gl.arange(0, BN, layout=rl)
        i = 0
        sc, mn = _segment_scales(s_ptr, mn_ptr, ar, T, per, dpt, KT, MT, K, G, BM, BN, BKX, (dpt == 0).to(gl.int32))
        launch_dependents(PDL)
        grid_wait(PDL)
        for seg in range(2):
            start, end, first, last, step = stream_k_segment(T, per, dpt, KT, seg)
            if (seg == 1) & (dpt > 0):  # the whole tiles came first; scales of this run's first tile
                sc, mn = _segment_scales(s_ptr, mn_ptr, ar, T, per, dpt, KT, MT, K, G, BM, BN, BKX, seg)
            for t in range(first, last + 1, step):
                k_lo = gl.maximum(start - t * KT, 0)
                k_hi = gl.minimum(end - t * KT, KT)
                m0, n0 = stream_k_tile(t, MT, BM, BN)
                _, n_next = stream_k_tile(gl.minimum(t + step, last), MT, BM, BN)
                rows = (n0 + ar) * (K // G)
                rows_next = (n_next + ar) * (K // G)  # the next tile starts at group 0
                for kk in range(k_lo, k_hi):
                    _fill_slot(x_desc, w_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, i, m0, n0, kk * BKX,
                               sc, mn, BLOCKS)
                    nxt = gl.where(kk + 1 < k_hi, rows + ((kk + 1) * BKX) // G, rows_next)  # one tile ahead
                    sc = gl.load(s_ptr + nxt)
                    mn = gl.load(mn_ptr + nxt)
                    i += 1

    @gluon.jit
    def _segment_scales(s_ptr, mn_ptr, ar, T, per, dpt, KT, MT, K, G: gl.constexpr, BM: gl.constexpr,
                        BN: gl.constexpr, BKX: gl.constexpr, seg):
        """Scales / mins of the first K tile of segment `seg` (an empty segment: of the last tile's
        last K tile, which is in bounds)."""
        start, end, first, last, step = stream_k_segment(T, per, dpt, KT, seg)
        t = gl.minimum(first, T // KT - 1)
        _, n0 = stream_k_tile(t, MT, BM, BN)
        g = (gl.minimum(gl.maximum(start - t * KT, 0), KT - 1) * BKX) // G
        return gl.load(s_ptr + (n0 + ar) * (K // G) + g), gl.load(mn_ptr + (n0 + ar) * (K // G) + g)

    @gluon.jit
    def ring_barriers(STAGES: gl.constexpr, READY: gl.constexpr, CONSUMERS: gl.constexpr):
        """The mbarriers of a STAGES-deep shared-memory ring: `ready[s]` completes after READY
        arrivals (the TMA bytes, plus any stores of the load warp), `empty[s]` once every consumer
        partition has released slot s."""
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=READY)
            mbarrier.init(empty.index(i), count=CONSUMERS)
        return ready, empty

    @gluon.jit
    def k_slice(K, BKX: gl.constexpr, SPLIT_K: gl.constexpr):
        """This program's split-K slice (grid axis 2) of the K / BKX tiles: (first tile, count)."""
        kt = K // BKX
        per = gl.cdiv(kt, SPLIT_K)
        t0 = gl.program_id(2) * per
        return t0, gl.minimum(per, kt - t0)

    @gluon.jit
    def token_scaled(acc, mma: gl.constexpr, xs_ptr, m0, M):
        """acc [BN weight rows, BM tokens from m0] (layout `mma`) times each token's activation scale:
        the activations were integer / fp8 codes. A tile that ends inside M loads its scales unmasked:
        with M unspecialized (`w4a16_wgmma_kernel`) the masked load is one scalar load per token, and
        on the H200 that cost `w4a8_progressive`'s 256 x 128 tile 4% at 1024 tokens (stop 62)."""
        BMT: gl.constexpr = acc.type.shape[1]
        offs_m = m0 + gl.arange(0, BMT, layout=gl.SliceLayout(0, mma))
        if m0 + BMT <= M:
            xs = gl.load(xs_ptr + offs_m)
        else:
            xs = gl.load(xs_ptr + offs_m, mask=offs_m < M, other=0.0)
        return acc * xs[None, :]

    @gluon.jit
    def store_out(out, mma: gl.constexpr, y_ptr, m0, n0, M, N):
        """Stores the final tile out [BN weight rows from n0, BM tokens from m0] to y [M, N]."""
        offs_n = n0 + gl.arange(0, out.type.shape[0], layout=gl.SliceLayout(1, mma))
        offs_m = m0 + gl.arange(0, out.type.shape[1], layout=gl.SliceLayout(0, mma))
        gl.store(y_ptr + offs_m[None, :] * N + offs_n[:, None], out, mask=(offs_m < M)[None, :])

    @gluon.constexpr_function
    def row_store_layout(BN, warps):
        """[BN, BM] layout whose lanes hold 8 consecutive weight rows of one token: 16-byte stores,
        8 lanes per 128-byte line of y. None where BN does not fit it."""
        if BN < 8 or BN // 8 > 32:
            return None
        return gl.BlockedLayout([8, 1], [BN // 8, 32 // (BN // 8)], [1, warps], [0, 1])

    @gluon.jit
    def store_rows(out, mma: gl.constexpr, y_ptr, m0, n0, M, N, WARPS: gl.constexpr):
        """store_out of the final tile (layout `mma`) through `row_store_layout` (one shared-memory
        round trip). From the wgmma layout, where a lane holds two tokens of a row, every element is
        a 2-byte store with its own 64-bit address, which spilled beside a live second accumulator
        (stop 27)."""
        cl: gl.constexpr = row_store_layout(out.type.shape[0], WARPS)
        if cl is not None:
            store_out(gl.convert_layout(out, cl), cl, y_ptr, m0, n0, M, N)
        else:
            store_out(out, mma, y_ptr, m0, n0, M, N)

    @gluon.jit
    def store_final(out, mma: gl.constexpr, y_ptr, m0, n0, M, N, WARPS: gl.constexpr, VEC: gl.constexpr):
        """The finished tile (y's dtype, layout `mma`) to y: through `store_rows` with VEC, else
        straight from the wgmma layout."""
        if VEC:
            store_rows(out, mma, y_ptr, m0, n0, M, N, WARPS)
        else:
            store_out(out, mma, y_ptr, m0, n0, M, N)

    @gluon.jit
    def _store_tile(acc, mma: gl.constexpr, y_ptr, ws_ptr, cnt_ptr, xs_ptr, m0, n0, M, N, part, NPART: gl.constexpr,
                    SPLIT_K: gl.constexpr, TOKEN_SCALES: gl.constexpr, WARPS: gl.constexpr,
                    VEC: gl.constexpr = False):
        """Writes the fp32 tile acc [BN weight rows from n0, BM tokens from m0] (layout `mma`) to y
        [M, N]: times each token's scale with TOKEN_SCALES; with SPLIT_K > 1 through splitk.py's
        deterministic one-launch reduction (`part`: this consumer's row block of the CTA; WARPS:
        the consumer's warps)."""
        BN: gl.constexpr = acc.type.shape[0]
        BM: gl.constexpr = acc.type.shape[1]
        offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
        offs_m = m0 + gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
        offs = offs_m[None, :] * N + offs_n[:, None]  # (split-K; computed here, as before stop 28's
        mask = (offs_m < M)[None, :]  # store_final, so the split-K kernels compile as they did)
        if TOKEN_SCALES:
            acc = token_scaled(acc, mma, xs_ptr, m0, M)
        if SPLIT_K == 1:
            store_final(acc.to(y_ptr.dtype.element_ty), mma, y_ptr, m0, n0, M, N, WARPS, VEC)
        else:  # the deterministic one-launch reduction of splitk.py: the last slice sums in slice order
            n_out = M * N
            gl.store(ws_ptr + gl.program_id(2) * n_out + offs, acc, mask=mask)
            _cta_barrier()  # every thread's partial is written before the counter moves
            tile = (gl.program_id(1) * gl.num_programs(0) + gl.program_id(0)) * NPART + part
            arrived = gl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                # TC tokens at a time in a row-contiguous layout, the loads of all slices unrolled:
                # a whole [BN, BM] sum beside SPLIT_K tiles in flight spilled (up to 900 bytes per
                # thread, ptxas 12.8; stop 26). Same slice order, so the same bits.
                TC: gl.constexpr = 32 if BM > 32 else BM
                cl: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (BN // 4), BN // 4], [WARPS, 1], [1, 0])
                c_rows = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, cl))
                for j in gl.static_range(BM // TC):
                    tok = m0 + j * TC + gl.arange(0, TC, layout=gl.SliceLayout(1, cl))
                    c_offs = tok[:, None] * N + c_rows[None, :]
                    c_mask = (tok < M)[:, None]
                    tot = gl.zeros([TC, BN], gl.float32, layout=cl)
                    for sl in gl.static_range(SPLIT_K):
                        tot += gl.load(ws_ptr + sl * n_out + c_offs, mask=c_mask, other=0.0, cache_modifier=".cg")
                    gl.store(y_ptr + c_offs, tot.to(y_ptr.dtype.element_ty), mask=c_mask)
                gl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")

    @gluon.jit
    def _slot_weights(w_bufs, sc_bufs, mn_bufs, ready, i, ROW0: gl.constexpr, BN: gl.constexpr,
                      NPART: gl.constexpr, BKX: gl.constexpr, F16: gl.constexpr, bl: gl.constexpr,
                      PACKED: gl.constexpr):
        """Waits for ring slot i and dequantizes this consumer's rows [ROW0, ROW0 + BN) of its weight
        tile into registers laid out as the wgmma A fragment ([BN, BKX] in x's dtype)."""
        STAGES: gl.constexpr = w_bufs.type.shape[0]
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        if _ABLATE == 3:
            b = gl.full([BN, BKX // 2], 0x5A, gl.int32, layout=bl)
        else:
            b = w_bufs.index(s).reshape([BN * NPART, BKX // 2]).slice(ROW0, BN).load(bl).to(gl.int32)
        if _ABLATE == 0 and PACKED:
            DT: gl.constexpr = gl.float16 if F16 else gl.bfloat16
            s2 = pack_pair(sc_bufs.index(s).slice(ROW0, BN).load(gl.SliceLayout(1, bl)), DT)
            m2 = pack_pair(mn_bufs.index(s).slice(ROW0, BN).load(gl.SliceLayout(1, bl)), DT)
            lo, hi = dequant_bytes_x2(b, s2[:, None], m2[:, None], F16)
        elif _ABLATE == 0:
            sc = sc_bufs.index(s).slice(ROW0, BN).load(gl.SliceLayout(1, bl)).to(gl.float32)
            c = mn_bufs.index(s).slice(ROW0, BN).load(gl.SliceLayout(1, bl)).to(gl.float32) - 128.0 * sc
            lo, hi = dequant_bytes(b, sc[:, None], c[:, None], F16)
        else:
            lo, hi = gl.inline_asm_elementwise(_MAGIC_ONLY, "=h,=h,r", [b], dtype=(gl.bfloat16, gl.bfloat16),
                                               is_pure=True, pack=1)
            if F16:
                lo = lo.to(gl.float16, bitcast=True)
                hi = hi.to(gl.float16, bitcast=True)
        return gl.reshape(gl.join(lo, hi), [BN, BKX])

    @gluon.jit
    def _a_smem_step(x_bufs, w_bufs, a_bufs, sc_bufs, mn_bufs, ready, empty, acc, i, ROW0: gl.constexpr,
                     BN: gl.constexpr, NPART: gl.constexpr, F16: gl.constexpr, bl: gl.constexpr,
                     PACKED: gl.constexpr):
        """Tile i of an A-through-shared-memory consumer: dequantized into buffer i % 2, its wgmma
        left in flight (tile i - 1's retired). `_mma_partition` runs tile 0 before its loop: a loop
        that may run zero times zeroes the accumulator on its skip path, between the wgmmas and
        their last wait, and ptxas 12.8 then serializes every wgmma of the kernel (C7515; stop 29)."""
        STAGES: gl.constexpr = x_bufs.type.shape[0]
        BKX: gl.constexpr = x_bufs.type.shape[2]
        w = _slot_weights(w_bufs, sc_bufs, mn_bufs, ready, i, ROW0, BN, NPART, BKX, F16, bl, PACKED)
        a_s = a_bufs.index(i % 2)
        a_s.store(w)
        fence_async_shared()
        acc = warpgroup_mma(a_s, x_bufs.index(i % STAGES).permute((1, 0)), acc, is_async=True)
        return warpgroup_mma_wait(1, deps=(acc,))

    @gluon.jit
    def _mma_partition(x_bufs, w_bufs, a_bufs, sc_bufs, mn_bufs, ready, empty, y_ptr, ws_ptr, cnt_ptr, xs_ptr, m0, n0,
                       M, N, num_k, ROW0: gl.constexpr, BN: gl.constexpr, NPART: gl.constexpr, F16: gl.constexpr,
                       A_SMEM: gl.constexpr, SPLIT_K: gl.constexpr, TOKEN_SCALES: gl.constexpr,
                       WARPS: gl.constexpr, PACKED: gl.constexpr, VEC: gl.constexpr):
        """Weight rows [ROW0, ROW0 + BN) of the tile (NPART consumer partitions split its rows)."""
        STAGES: gl.constexpr = x_bufs.type.shape[0]
        BM: gl.constexpr = x_bufs.type.shape[1]
        BKX: gl.constexpr = x_bufs.type.shape[2]
        mma: gl.constexpr = acc_layout(BM, WARPS)
        dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        bl: gl.constexpr = byte_layout(BN, BKX // 2, WARPS)
        acc = gl.zeros([BN, BM], gl.float32, layout=mma)
        lo = 0
        if A_SMEM:  # the first tile peeled off the loop (see _a_smem_step)
            acc = _a_smem_step(x_bufs, w_bufs, a_bufs, sc_bufs, mn_bufs, ready, empty, acc, 0, ROW0, BN, NPART, F16,
                               bl, PACKED)
            lo = 1
        for i in range(lo, num_k):
            if A_SMEM:
                # the dequantized tile goes to one of two shared buffers and the wgmma reads it there:
                # tile i+1 is dequantized while tile i's wgmma runs (the buffer it overwrites was read
                # by tile i-1's wgmma, retired by the wait in _a_smem_step one iteration earlier)
                acc = _a_smem_step(x_bufs, w_bufs, a_bufs, sc_bufs, mn_bufs, ready, empty, acc, i, ROW0, BN, NPART,
                                   F16, bl, PACKED)
                done = i - 1  # tile i-1's slot is free
            else:
                w = _slot_weights(w_bufs, sc_bufs, mn_bufs, ready, i, ROW0, BN, NPART, BKX, F16, bl, PACKED)
                # A straight from registers. The wgmma must retire before the next tile's dequant:
                # Triton 3.6 does not keep the packed A registers of an in-flight wgmma alive (a
                # dependency on the tensor covers its 16-bit halves only), so the next dequant
                # could overwrite them (measured: wrong rows g+8 with one wgmma left pending).
                # Two tiles per loop body (distinct A registers) fix that, but ptxas 12.8 pipelines
                # such wgmmas only in the default partition, and where it does they did not pay
                # (stop 26, benchmarks/tc_ablations/pipelined_a.py, results/pipelined_a.patch).
                a = gl.convert_layout(w, dot, assert_trivial=True)
                acc = warpgroup_mma(a, x_bufs.index(i % STAGES).permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(0, deps=(acc,))
                done = i
            # no proxy fence before handing the slot back: its bytes and scales were read into
            # registers and consumed before this point
            mbarrier.arrive(empty.index((done + STAGES) % STAGES), pred=done >= 0)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        _store_tile(acc, mma, y_ptr, ws_ptr, cnt_ptr, xs_ptr, m0, n0 + ROW0, M, N, ROW0 // BN, NPART, SPLIT_K,
                    TOKEN_SCALES, WARPS, VEC)

    @gluon.jit
    def _store_segment_sk(acc, mma: gl.constexpr, y_ptr, ws_ptr, cnt_ptr, xs_ptr, t, first, k_lo, k_hi, m0, n0, M, N,
                          per, base, KT, ROW0: gl.constexpr, NPART: gl.constexpr, HALF: gl.constexpr,
                          NHALF: gl.constexpr, TOKEN_SCALES: gl.constexpr, WARPS: gl.constexpr,
                          CMAX: gl.constexpr, VEC: gl.constexpr = False):
        """The end of one output tile's K run in a stream-K program. A run over all of K stores the
        tile; otherwise the fp32 partial goes to this program's workspace slot (one for the run it
        started in, one for the run it ended in), and the last of the tile's programs to arrive
        sums the partials in program order (= K order; fixed, so the bits are reproducible) and
        stores. acc: rows [ROW0, ROW0 + BN) of the tile's [BN * NPART] weight rows from n0, for
        tokens m0.. (token block HALF of NHALF that the tile's consumers keep apart)."""
        BN: gl.constexpr = acc.type.shape[0]
        BM: gl.constexpr = acc.type.shape[1]
        BNC: gl.constexpr = BN * NPART
        rows = gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
        cols = gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
        offs_m = m0 + cols
        if TOKEN_SCALES:
            acc = token_scaled(acc, mma, xs_ptr, m0, M)
        if (k_lo == 0) & (k_hi == KT):
            store_final(acc.to(y_ptr.dtype.element_ty), mma, y_ptr, m0, n0 + ROW0, M, N, WARPS, VEC)
        else:
            # a slot is [BM, BNC] fp32, weight rows contiguous as in y
            slot = (gl.program_id(0) * 2 + (t != first).to(gl.int32)) * NHALF + HALF
            gl.store(ws_ptr + slot * (BNC * BM) + cols[None, :] * BNC + (ROW0 + rows)[:, None], acc)
            _cta_barrier()  # every thread's partial is written before the counter moves
            c_first = (t * KT - base) // per  # (the runs start after the whole tiles, at iteration base)
            c_last = ((t + 1) * KT - 1 - base) // per
            counter = cnt_ptr + (t * NHALF + HALF) * NPART + ROW0 // BN
            arrived = gl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if arrived == c_last - c_first:
                # summed TC tokens at a time in a row-contiguous layout (a whole [BN, BM] sum beside
                # the accumulator would spill at BM = 256), over at most CMAX programs, unrolled so
                # that the loads of all partials go out together (a loop over them waited for each)
                TC: gl.constexpr = 32
                cl: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (BN // 4), BN // 4], [WARPS, 1], [1, 0])
                c_rows = ROW0 + gl.arange(0, BN, layout=gl.SliceLayout(0, cl))
                for j in gl.static_range(BM // TC):
                    c_cols = j * TC + gl.arange(0, TC, layout=gl.SliceLayout(1, cl))
                    local = c_cols[:, None] * BNC + c_rows[None, :]
                    tot = gl.zeros([TC, BN], gl.float32, layout=cl)
                    for ci in gl.static_range(CMAX):
                        c = c_first + ci
                        slot_c = (c * 2 + ((base + c * per) // KT != t).to(gl.int32)) * NHALF + HALF
                        # (local >= 0 is always true: it broadcasts the scalar condition to the chunk)
                        tot += gl.load(ws_ptr + slot_c * (BNC * BM) + local, mask=(c <= c_last) & (local >= 0),
                                       other=0.0, cache_modifier=".cg")
                    tok = m0 + c_cols
                    gl.store(y_ptr + tok[:, None] * N + (n0 + c_rows)[None, :], tot.to(y_ptr.dtype.element_ty),
                             mask=(tok < M)[:, None])
                gl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")

    @gluon.jit
    def _mma_partition_sk(x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, y_ptr, ws_ptr, cnt_ptr, xs_ptr, M, N, T,
                          per, dpt, KT, MT, ROW0: gl.constexpr, BN: gl.constexpr, NPART: gl.constexpr,
                          F16: gl.constexpr, TOKEN_SCALES: gl.constexpr, WARPS: gl.constexpr, CMAX: gl.constexpr,
                          PACKED: gl.constexpr, VEC: gl.constexpr):
        """A stream-K consumer (A in registers): the program's run of iterations, one output tile's
        K range at a time, each ended by `_store_segment_sk`."""
        STAGES: gl.constexpr = x_bufs.type.shape[0]
        BM: gl.constexpr = x_bufs.type.shape[1]
        BKX: gl.constexpr = x_bufs.type.shape[2]
        mma: gl.constexpr = acc_layout(BM, WARPS)
        dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        bl: gl.constexpr = byte_layout(BN, BKX // 2, WARPS)
        base = gl.num_programs(0) * dpt
        i = 0
        for seg in range(2):
            start, end, first, last, step = stream_k_segment(T, per, dpt, KT, seg)
            for t in range(first, last + 1, step):
                k_lo = gl.maximum(start - t * KT, 0)
                k_hi = gl.minimum(end - t * KT, KT)
                acc = gl.zeros([BN, BM], gl.float32, layout=mma)
                for _ in range(k_lo, k_hi):
                    w = _slot_weights(w_bufs, sc_bufs, mn_bufs, ready, i, ROW0, BN, NPART, BKX, F16, bl, PACKED)
                    a = gl.convert_layout(w, dot, assert_trivial=True)
                    acc = warpgroup_mma(a, x_bufs.index(i % STAGES).permute((1, 0)), acc, is_async=True)
                    acc = warpgroup_mma_wait(0, deps=(acc,))  # retire before the next dequant (`_mma_partition`)
                    mbarrier.arrive(empty.index(i % STAGES))
                    i += 1
                m0, n0 = stream_k_tile(t, MT, BM, BN * NPART)
                _store_segment_sk(acc, mma, y_ptr, ws_ptr, cnt_ptr, xs_ptr, t, first, k_lo, k_hi, m0, n0, M, N, per,
                                  base, KT, ROW0, NPART, 0, 1, TOKEN_SCALES, WARPS, CMAX, VEC)

    # (M and stream-K's run lengths change with every prefill's token count, and Triton compiles a variant per
    # class of an int argument (= 1, divisible by 16, or neither): a server met one the warm-up had not, a 4.4 s
    # stall on an H200. Unspecialized: the same time per call, fewer variants (`benchmarks/unspecialized_ab.py`;
    # the kernels on codes lost 1-5% at token counts divisible by 16 until `token_scaled` loaded whole tiles'
    # scales unmasked, stop 62); CMAX and PACKED still vary with M)
    @gluon.jit(do_not_specialize=("M", "per", "dpt"))
    def w4a16_wgmma_kernel(x_desc, w_desc, s_ptr, mn_ptr, y_ptr, ws_ptr, cnt_ptr, xs_ptr, M, N, K, per, dpt,
                           G: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, BLOCKS: gl.constexpr,
                           F16: gl.constexpr, A_SMEM: gl.constexpr, SPLIT_K: gl.constexpr, CONSUMERS: gl.constexpr,
                           TOKEN_SCALES: gl.constexpr, STREAM_K: gl.constexpr, CMAX: gl.constexpr,
                           PACKED: gl.constexpr, PDL: gl.constexpr, num_warps: gl.constexpr,
                           VEC_STORE: gl.constexpr = False):
        """One output tile per program (grid: N tiles x M tiles x split-K slices), or with STREAM_K a
        persistent grid whose program p runs iterations [p * per, (p + 1) * per) of the
        (output tile, K tile) sequence (with dpt > 0 after dpt iterations of whole tiles of its own:
        `stream_k_segment`)."""
        BM: gl.constexpr = x_desc.block_type.shape[0]
        BKX: gl.constexpr = x_desc.block_type.shape[1]
        x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
        w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
        A_ROWS: gl.constexpr = BN if A_SMEM else 16  # a token buffer when A stays in registers
        a_bufs = gl.allocate_shared_memory(x_desc.dtype, [2 if A_SMEM else 1, A_ROWS, BKX],
                                           gl.NVMMASharedLayout.get_default_for([A_ROWS, BKX], x_desc.dtype))
        sc_bufs = gl.allocate_shared_memory(gl.float16, [STAGES, BN], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        mn_bufs = gl.allocate_shared_memory(gl.float16, [STAGES, BN], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        ready, empty = ring_barriers(STAGES, 2, CONSUMERS)  # the TMA bytes, and the load warp's scale stores
        if STREAM_K:
            KT = K // BKX
            MT = gl.cdiv(M, BM)
            T = MT * (N // BN) * KT
            half: gl.constexpr = BN // CONSUMERS
            if CONSUMERS == 1:
                gl.warp_specialize([
                    (_mma_partition_sk, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, y_ptr, ws_ptr, cnt_ptr,
                                         xs_ptr, M, N, T, per, dpt, KT, MT, 0, BN, 1, F16, TOKEN_SCALES, num_warps,
                                         CMAX, PACKED, VEC_STORE)),
                    (_load_partition_sk, (x_desc, w_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, s_ptr,
                                          mn_ptr, T, per, dpt, KT, MT, K, G, BLOCKS, PDL)),
                ], [1], [64])
            else:
                gl.warp_specialize([
                    (_mma_partition_sk, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, y_ptr, ws_ptr, cnt_ptr,
                                         xs_ptr, M, N, T, per, dpt, KT, MT, 0, half, 2, F16, TOKEN_SCALES,
                                         num_warps, CMAX, PACKED, VEC_STORE)),
                    (_mma_partition_sk, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, y_ptr, ws_ptr, cnt_ptr,
                                         xs_ptr, M, N, T, per, dpt, KT, MT, half, half, 2, F16, TOKEN_SCALES,
                                         num_warps, CMAX, PACKED, VEC_STORE)),
                    (_load_partition_sk, (x_desc, w_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, s_ptr,
                                          mn_ptr, T, per, dpt, KT, MT, K, G, BLOCKS, PDL)),
                ], [num_warps, 1], [232, 40])
        else:
            m0 = gl.program_id(1) * BM
            n0 = gl.program_id(0) * BN
            t0, num_k = k_slice(K, BKX, SPLIT_K)
            if CONSUMERS == 1:
                gl.warp_specialize([
                    (_mma_partition, (x_bufs, w_bufs, a_bufs, sc_bufs, mn_bufs, ready, empty, y_ptr, ws_ptr, cnt_ptr,
                                      xs_ptr, m0, n0, M, N, num_k, 0, BN, 1, F16, A_SMEM, SPLIT_K, TOKEN_SCALES,
                                      num_warps, PACKED, VEC_STORE)),
                    (_load_partition, (x_desc, w_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, s_ptr, mn_ptr,
                                       m0, n0, t0, num_k, K, G, BLOCKS, PDL)),
                ], [1], [64])
            else:  # two independent 4-warp consumers on the two row halves: one dequantizes while the
                # other's wgmma runs (no CTA-wide barrier couples them; each hands slots back itself)
                half: gl.constexpr = BN // 2
                gl.warp_specialize([
                    (_mma_partition, (x_bufs, w_bufs, a_bufs, sc_bufs, mn_bufs, ready, empty, y_ptr, ws_ptr, cnt_ptr,
                                      xs_ptr, m0, n0, M, N, num_k, 0, half, 2, F16, A_SMEM, SPLIT_K, TOKEN_SCALES,
                                      num_warps, PACKED, VEC_STORE)),
                    (_mma_partition, (x_bufs, w_bufs, a_bufs, sc_bufs, mn_bufs, ready, empty, y_ptr, ws_ptr, cnt_ptr,
                                      xs_ptr, m0, n0, M, N, num_k, half, half, 2, F16, A_SMEM, SPLIT_K, TOKEN_SCALES,
                                      num_warps, PACKED, VEC_STORE)),
                    (_load_partition, (x_desc, w_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, s_ptr, mn_ptr,
                                       m0, n0, t0, num_k, K, G, BLOCKS, PDL)),
                ], [num_warps, 1], [232, 40])

    @functools.lru_cache(maxsize=None)
    def act_layout(bm: int, bk: int, dtype):
        """Shared layout of a [bm, bk] activation tile: cached, building it costs host microseconds
        per call (eager decode, benchmarks/host_overhead.py)."""
        return gl.NVMMASharedLayout.get_default_for([bm, bk], dtype)

    def _descriptors(x2: torch.Tensor, store: Int4Weight, bm: int, bn: int, bk: int = BK):
        """TMA descriptors of the activations [M, K] and of the weight bytes (row layout: [N, K/2];
        blocks16: the [N/16, K/128 * 16, 64] view whose [BN/16, 16, bk/2] box is the same tile)."""
        xdt = gl.float16 if x2.dtype == torch.float16 else gl.bfloat16
        x_desc = TensorDescriptor.from_tensor(x2, [bm, bk], act_layout(bm, bk, xdt))
        return x_desc, _weight_descriptor(store, bn, bk)

    def _weight_descriptor(store: Int4Weight, bn: int, bk: int, swizzle: int | None = None):
        """`swizzle` (bytes, <= bk / 2): the TMA shared-memory swizzle of the byte tile; default: a
        row's width (bk / 2) when `SWIZZLE_WEIGHTS`, else none. Built once per store and tile."""
        if swizzle is None:
            swizzle = bk // 2 if SWIZZLE_WEIGHTS else 0
        return store_descriptors(store, ("bytes", bn, bk, swizzle),
                                 lambda: _build_weight_descriptor(store, bn, bk, swizzle))

    def _build_weight_descriptor(store: Int4Weight, bn: int, bk: int, swizzle: int):
        n, k = store.out_features, store.in_features
        if store.layout == BLOCKS16:
            qw = store.qweight.view(n // 16, (k // 128) * 16, 64)
            block = [bn // 16, 16, bk // 2]
        else:
            qw = store.qweight
            block = [bn, bk // 2]
        layout = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=8, rank=len(block))
        return TensorDescriptor.from_tensor(qw, block, layout)


#: where x's storage ends at x (a producer without `tile_room.empty_rows`; otherwise the kernel reads the rows past x
#: in place, stop 72), pad it to whole token tiles (`tma_rows`, one `pad_rows` launch) where at least this many eighths
#: of the last tile's rows lie past x (PAD_ONE_TILE_EIGHTHS where that tile is the only one); -1: never. Such TMA
#: boxes read slowly: on the H200 (stop 71, `benchmarks/results/h200_stop71.md`) the map's picks took gate_up
#: 62.9 us at 33 tokens (31 of 64 rows absent) against 43.8 at 64, and 50.6 on padded rows; the 32-layer W4A16
#: step 16.1 ms at 257 tokens and 10.4 padded. The copy is not free (torch's pad, a plain launch between two PDL
#: launches, cost about 5 us a linear): with a quarter of the last of three tiles absent (700 tokens) padding
#: lost 4.6%, with a quarter of the only tile (41-47 tokens) it gained 6-12%. The same bits either way: the padded
#: rows feed only output rows that are never stored.
PAD_ABSENT_EIGHTHS = 3
PAD_ONE_TILE_EIGHTHS = 2


def tma_rows(x2: torch.Tensor, bm: int) -> torch.Tensor:
    """x2 [M, K], or x2's rows up to a multiple of bm (the kernel is still told M): from x2's own storage where it
    holds them (`tile_room.rows_in_storage`), else zero rows where `PAD_ABSENT_EIGHTHS` (one token tile:
    `PAD_ONE_TILE_EIGHTHS`) of the last tile's rows would lie past M."""
    m = x2.shape[0]
    absent = -m % bm
    eighths = PAD_ONE_TILE_EIGHTHS if m < bm else PAD_ABSENT_EIGHTHS
    copy = PAD_ABSENT_EIGHTHS >= 0 and eighths >= 0 and 8 * absent >= eighths * bm
    return whole_tiles(x2, bm, copy)


#: when the consumers dequantize in packed 16-bit math (`dequant_bytes_x2`): "exact" (default) where
#: that gives the fp32 path's bits (`packed_dequant`), "never", or "always" (timing experiments only:
#: it rounds a bf16 model's fp16 scales and mins to bf16)
PACKED_DEQUANT = "exact"
#: and under "exact" only up to this many tokens. Stop 46 (`policy_ab.py`, the W4A16 step on bf16-valued
#: stores, packed against `PACKED_DEQUANT=never`, H100): 0.927-0.965 at 64-2048 tokens, 1.009 / 1.023 at 4096
#: in two calls (the tiles there were profiled on the fp32 path). Same bits either way.
PACKED_MAX_TOKENS = 2048

_PACKED_OK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def packed_exact(scales: torch.Tensor, mins: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether one `dtype` FMA q * s + m (packed path) rounds to the bits of the fp32 path
    ((128 + q) * s + (m - 128 s) in fp32, then one conversion) for every group: s and m must be
    `dtype` values, and m zero or within 2^-6..2^12 of s, so that m - 128 s and q * s + m are
    exact in fp32 (then both round the same exact value once). Default int4 stores pass for fp16
    activations (m = -z s); for bf16 only stores whose fp16 scales are bf16 values pass, as
    int4-prog stores do by construction (s = t * unit with t < 256)."""
    s, m = scales.float(), mins.float()
    if not all(torch.equal(t.to(dtype).float(), t.float()) for t in (scales, mins)):
        return False
    ratio = m.abs() / s.abs().clamp_min(torch.finfo(torch.float32).tiny)
    return bool(((m == 0) | (s == 0) | ((ratio >= 2.0 ** -6) & (ratio <= 2.0 ** 12))).all())


def packed_dequant(store: Int4Weight, x_dtype: torch.dtype, m: int = 1) -> bool:
    """Run `dequant_bytes_x2` on this store for m tokens (see `PACKED_DEQUANT`, `PACKED_MAX_TOKENS`)?
    Checked once per store and activation dtype, again after its scales or mins change; inside a
    CUDA-graph capture an unchecked store takes the fp32 path (the same bits; the check would synchronize)."""
    if PACKED_DEQUANT != "exact":
        return PACKED_DEQUANT == "always"
    if m > PACKED_MAX_TOKENS:
        return False
    sc, mn = store.scales, store.mins
    key = (x_dtype, sc.data_ptr(), mn.data_ptr(), sc._version, mn._version)
    per = _PACKED_OK.setdefault(store, {})
    if per.get(x_dtype, (None,))[0] != key:
        if sc.is_cuda and torch.cuda.is_current_stream_capturing():
            return False
        per[x_dtype] = (key, packed_exact(sc, mn, x_dtype))
    return per[x_dtype][1]


_STORE_DESCRIPTORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def store_descriptors(store: Int4Weight, key: tuple, build):
    """TMA descriptors of a weight store's tensors, built once per (store, key): building one costs
    about 15 us of host time, which at decode sizes is as long as the kernel (eager mode; a CUDA
    graph does not pay it). Rebuilt when the store's tensors have moved (e.g. `Module.to`)."""
    ptrs = (store.qweight.data_ptr(), store.scales.data_ptr(), store.mins.data_ptr())
    per = _STORE_DESCRIPTORS.setdefault(store, {})
    hit = per.get(key)
    if hit is None or hit[0] != ptrs:
        hit = per[key] = (ptrs, build())
    return hit[1]


#: (BM tokens, BN weight rows, warps, stages, A through shared memory, register cap, split-K, BK).
#: A in registers retires each wgmma before the next dequant, so something else must overlap them:
#: with 4 warps a register cap that fits 2-3 CTAs per SM, with 8 warps two independent consumer
#: partitions (`_two_consumers`). Split-K fills the SMs where N / BN tiles are few (N = 4096).
#: BK = 128 halves the per-tile barrier / wait overhead at the price of fewer stages (and, with the
#: swizzled byte tile, the fastest of the measured tiles at M = 256 on every shape: stop 16).
_SMALL = ((64, 64, 4, 6, False, 128, 1, 64), (64, 64, 4, 4, False, 80, 1, 64), (64, 64, 4, 6, False, 80, 1, 64),
          (128, 64, 4, 4, False, 128, 1, 64), (128, 64, 4, 3, False, 128, 1, 64), (64, 64, 4, 6, True, 128, 1, 64),
          (128, 64, 4, 4, True, 128, 1, 64), (128, 128, 8, 4, False, 0, 1, 64), (64, 128, 8, 6, False, 0, 1, 64),
          (64, 64, 4, 4, False, 80, 2, 64), (64, 64, 4, 4, False, 80, 4, 64), (128, 64, 4, 4, False, 128, 2, 64),
          (128, 64, 4, 3, False, 128, 4, 64), (128, 128, 8, 4, False, 0, 2, 64), (128, 64, 4, 3, False, 128, 1, 128),
          (64, 64, 4, 4, False, 80, 1, 128), (64, 64, 4, 4, False, 128, 1, 128), (128, 64, 4, 2, False, 128, 1, 128),
          (128, 128, 8, 3, False, 0, 1, 128), (64, 128, 8, 4, False, 0, 1, 128), (128, 64, 4, 3, False, 128, 2, 128))
_LARGE = ((256, 128, 8, 4, False, 0, 1, 64), (256, 128, 8, 3, False, 0, 1, 64), (256, 128, 8, 3, True, 0, 1, 64),
          (256, 64, 4, 4, True, 0, 1, 64), (128, 64, 4, 4, False, 128, 1, 64), (128, 128, 8, 4, False, 0, 1, 64),
          (256, 128, 8, 4, False, 0, 2, 64), (256, 128, 8, 3, False, 0, 1, 128), (128, 64, 4, 3, False, 128, 1, 128),
          (128, 128, 8, 3, False, 0, 1, 128),
          # stop 23: BK = 128 (2-6x fewer barrier round trips per byte than BK = 64 at the same tile) with
          # 128 weight rows (half the activation traffic of 64) and split-K for the narrow shapes
          (128, 128, 8, 4, False, 0, 1, 128), (128, 128, 8, 3, False, 0, 2, 128), (128, 128, 8, 4, False, 0, 2, 128),
          (256, 128, 8, 3, False, 0, 2, 128), (64, 128, 8, 4, False, 0, 2, 128), (128, 64, 4, 3, False, 128, 2, 128),
          (256, 64, 4, 3, False, 0, 1, 128))


#: stream-K tiles (stop 24): (BM, BN, warps, stages, register cap, BK, programs per SM). The
#: one-tile-per-program grids of the winners above leave SMs idle at mid M: at M = 256 the
#: 128 x 64 tile makes 192 programs for qkv and 128 for o, where 132 SMs hold 2-3 each, and
#: gate_up's 256 x 128 tile makes 224 programs at one per SM (1.7 waves). A persistent grid that
#: splits the (tile, K tile) iterations evenly keeps every SM busy to the end.
_STREAM_K = ((128, 64, 4, 3, 128, 128, 2), (128, 64, 4, 2, 128, 128, 3), (128, 64, 4, 3, 128, 128, 1),
             (256, 128, 8, 3, 0, 128, 1), (128, 128, 8, 4, 0, 128, 1), (128, 128, 8, 3, 0, 128, 1),
             (64, 64, 4, 4, 80, 128, 2), (64, 64, 4, 4, 80, 128, 3), (256, 64, 4, 3, 0, 128, 1))


#: stream-K tiles also timed as hybrids (`TileConfig.hybrid`; from M = 256, where the large-M
#: tiles' grids have a partly filled last wave): (BM, BN, BK). Stop 28 also timed 128 x 128 and
#: 128 x 64 (2-3 programs per SM) hybrids: they never won
_HYBRID = ((256, 128, 128),)


def wgmma_configs(m: int) -> list[TileConfig]:
    """The tiles worth profiling at this M."""
    if m < 64:
        return []
    rows = _SMALL if m <= 128 else _SMALL + _LARGE if m <= 512 else _LARGE
    tiles = [TileConfig(bm, bn, bk, sk, w, st, a_smem=a, maxnreg=r) for bm, bn, w, st, a, r, sk, bk in dict.fromkeys(rows)
             if bm <= max(64, m)]
    return tiles + [TileConfig(bm, bn, bk, 1, w, st, maxnreg=r, stream_k=p, hybrid=h)
                    for bm, bn, w, st, r, bk, p in _STREAM_K for h in (False, True)
                    if bm <= max(64, m) and (not h or (m >= 256 and (bm, bn, bk) in _HYBRID))]


def smem_bytes(cfg: TileConfig, x_bytes: int = 2) -> int:
    """Shared memory of one CTA: the TMA ring (activations, weight bytes, scales / mins) and the
    dequantized-A buffers."""
    ring = cfg.stages * (cfg.bm * cfg.bk * x_bytes + cfg.bn * cfg.bk // 2 + 4 * cfg.bn)
    return ring + (2 * cfg.bn if cfg.a_smem else 16) * cfg.bk * x_bytes + 1024


def wgmma_supports(store, cfg: TileConfig | None, x_dtype: torch.dtype | None = None) -> bool:
    if not HAS_GLUON or not isinstance(store, Int4Weight) or cfg is None:
        return False
    n, k, g = store.out_features, store.in_features, store.group_size
    if cfg.bk not in BKS or cfg.split_k not in (1, 2, 4) or cfg.bm not in (64, 128, 256) or cfg.warps not in (4, 8):
        return False
    if cfg.stream_k and (cfg.split_k != 1 or cfg.a_smem or cfg.stream_k > 4):  # stream-K splits K itself
        return False
    if cfg.hybrid and not cfg.stream_k:
        return False
    if cfg.bn != 16 * cfg.warps:  # one 16-row group per warp (taller tiles: ptxas serializes the wgmmas)
        return False
    if cfg.bm * cfg.bn // (32 * cfg.warps) > 128 or smem_bytes(cfg) > 227 * 1024:  # accumulator regs, smem
        return False
    if n % cfg.bn or k % cfg.bk or g % cfg.bk or k // cfg.bk < 2 * cfg.split_k:
        return False
    if x_dtype is not None and x_dtype not in (torch.bfloat16, torch.float16):
        return False
    return _is_sm90_or_cpu()


@functools.lru_cache(maxsize=1)
def _is_sm90_or_cpu() -> bool:
    """wgmma exists on sm_90 only; on a CPU-only machine the kernel can still be compiled."""
    return not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] == 9


#: register cap of the two-consumer launch: 3 warpgroups share the 64K registers of an SM
#: (65536 / 384 = 170, rounded down to setmaxnreg's multiple of 8); `warp_specialize` then hands
#: the consumer partitions 232 each and the load warp 40
TWO_CONSUMER_REGS = 168


def _two_consumers(cfg: TileConfig) -> bool:
    """8 warps with A in registers run as two independent 4-warp consumer partitions (with A in
    shared memory, as one 8-warp partition whose wgmmas overlap the next dequant instead)."""
    return cfg.warps == 8 and not cfg.a_smem


def w4a16_wgmma(x2: torch.Tensor, store: Int4Weight, cfg: TileConfig,
                token_scales: torch.Tensor | None = None) -> torch.Tensor:
    """x2 [M, K] bf16/fp16 -> [M, N] in x2's dtype, on an sm_90 GPU. With `token_scales` [M]
    (fp32), x2 holds activation codes and row m of the result is multiplied by token_scales[m]."""
    if not wgmma_supports(store, cfg, x2.dtype):
        raise ValueError(f"w4a16_wgmma cannot run {cfg} on this store/device "
                         f"({store.out_features}x{store.in_features}, group {getattr(store, 'group_size', '?')}, "
                         f"x {x2.dtype}); wgmma_supports() says which")
    if x2.stride(1) != 1 or (x2.stride(0) * x2.element_size()) % 16 or x2.data_ptr() % 16:
        x2 = x2.contiguous()
    m = x2.shape[0]
    n, k = store.out_features, store.in_features
    y = torch.empty((m, n), device=x2.device, dtype=x2.dtype)
    x_desc, w_desc = _descriptors(tma_rows(x2, cfg.bm), store, cfg.bm, cfg.bn, cfg.bk)
    consumers = 2 if _two_consumers(cfg) else 1
    tiles = (n // cfg.bn) * -(-m // cfg.bm)
    per = cmax = dpt = 0
    if cfg.stream_k:
        per, programs, cmax, dpt = stream_k_launch(cfg, m, n, k, x2.device)
        grid = (programs,)
        ws = torch.empty(grid[0] * 2 * cfg.bn * cfg.bm, device=x2.device, dtype=torch.float32)
        cnt = counters(x2.device, tiles * consumers)
    else:
        grid = (n // cfg.bn, -(-m // cfg.bm), cfg.split_k)
        ws, cnt = splitk_buffers(y, cfg.split_k, m * n, tiles * consumers)
    regs = cfg.maxnreg or (TWO_CONSUMER_REGS if consumers == 2 else 0)
    pdl = WGMMA_PDL and pdl_enabled(y)
    xs = y if token_scales is None else token_scales
    w4a16_wgmma_kernel[grid](x_desc, w_desc, store.scales, store.mins, y, ws, cnt, xs, m, n, k, per, dpt,
                             G=store.group_size, BN=cfg.bn, STAGES=cfg.stages, BLOCKS=store.layout == BLOCKS16,
                             F16=x2.dtype == torch.float16, A_SMEM=cfg.a_smem, SPLIT_K=cfg.split_k,
                             CONSUMERS=consumers, TOKEN_SCALES=token_scales is not None,
                             STREAM_K=bool(cfg.stream_k), CMAX=cmax, PACKED=packed_dequant(store, x2.dtype, m),
                             PDL=pdl, num_warps=cfg.warps // consumers, VEC_STORE=WGMMA_VEC_STORE,
                             **({"maxnreg": regs} if regs else {}), **launch_kwargs(pdl))
    return y


def stream_k_grid(iters: int, programs: int) -> tuple[int, int]:
    """(iterations per program, programs) of a stream-K launch over `iters` (tile, K tile)
    iterations on at most `programs` programs: even runs, none empty. Program p runs
    [p * per, (p + 1) * per); a tile's runs belong to programs (t * KT) // per .. ((t + 1) * KT - 1) // per,
    and each program writes at most two partials (the tile it starts in, the tile it ends in)."""
    per = -(-iters // programs)
    return per, -(-iters // per)


def stream_k_launch(cfg: TileConfig, m: int, n: int, k: int, device: torch.device) -> tuple[int, int, int, int]:
    """(iterations per run, programs, most programs per tile, whole-tile iterations per program)
    of a stream-K launch of `cfg`."""
    kt = k // cfg.bk
    return stream_k_plan((n // cfg.bn) * -(-m // cfg.bm), kt, sm_count(device) * cfg.stream_k, cfg.hybrid)


def stream_k_plan(tiles: int, kt: int, programs: int, hybrid: bool) -> tuple[int, int, int, int]:
    """`stream_k_launch` for `tiles` output tiles of kt K tiles on at most `programs` programs.
    Hybrid: every program first runs tiles // programs whole tiles of its own (no partials, no
    counters), and only the rest is split; without whole waves it is the plain split."""
    waves = tiles // programs if hybrid else 0
    if not waves:
        per, grid = stream_k_grid(tiles * kt, programs)
        return per, grid, stream_k_contributors(kt, per), 0
    rest = (tiles - waves * programs) * kt
    per = max(1, -(-rest // programs))  # (rest = 0: every run is empty)
    return per, programs, stream_k_contributors(kt, per), waves * kt


def stream_k_runs(t: int, kt: int, per: int, base: int = 0) -> list[tuple[int, int]]:
    """The K tile ranges [lo, hi) of output tile t that separate programs run, in K order (the
    order in which the finisher adds their partials). base: the iterations of whole tiles that
    come before the runs (`stream_k_plan`)."""
    if (t + 1) * kt <= base:
        return [(0, kt)]
    lo, hi = t * kt - base, (t + 1) * kt - base
    cuts = [lo] + [c * per for c in range(lo // per + 1, (hi - 1) // per + 1)] + [hi]
    return [(a - lo, b - lo) for a, b in zip(cuts, cuts[1:])]


def stream_k_contributors(kt: int, per: int) -> int:
    """The most programs whose runs share one output tile of kt K tiles (runs of per iterations)."""
    return -(-(kt - 1) // per) + 1


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (a stream-K grid is a multiple of them)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def w4a8_wgmma(x2: torch.Tensor, store: Int4Weight, act, cfg: TileConfig) -> torch.Tensor:
    """W4A8 / W4A4 / W4A8-fp8 at M >= 64: the activations are quantized per token (Triton), their
    codes stored as exact 16-bit floats, and the same kernel runs them, scaling each token's
    output by its activation scale. DPR padding: P_X = (8) padded to 16 bits, as `w4a8_mma` does
    at M <= 16. Every product of a code and a 16-bit weight is exact in fp32, so this computes
    Q(x) @ dequant(W)^T with one rounding less than the torch reference."""
    from gearshift.kernels.act_quant import quantize_act_triton

    codes, scales = quantize_act_triton(x2, act, codes_dtype=x2.dtype)
    return w4a16_wgmma(codes, store, cfg, token_scales=scales)


def w4a16_wgmma_emulate(x2: torch.Tensor, store: Int4Weight) -> torch.Tensor:
    """The kernel's numerics in torch: each weight (128 + q) * s + (m - 128 s) in fp32 (one
    rounding: an FMA), rounded once to x's dtype, then an fp32-accumulated product."""
    q = store.unpacked().float()
    g = store.group_size
    s = store.scales.float().repeat_interleave(g, dim=1)
    c = store.mins.float().repeat_interleave(g, dim=1) - 128.0 * s
    w = torch.addcmul(c, q + 128.0, s).to(x2.dtype)  # the kernel's FMA rounds once; this may round twice
    return (x2.float() @ w.float().t()).to(x2.dtype)
