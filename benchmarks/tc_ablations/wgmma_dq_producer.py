"""W4A16 at large M with the dequantization in a partition of its own (GPU; stop 40).

`w4a16_wgmma`'s consumers dequantize their rows into registers and must retire each register-A
wgmma before the next dequant (ptxas 12.8 and 12.9 serialize a pipelined register-A wgmma in these
tiles; stop 26, stop 40). Here a 4-warp dequant partition writes each K tile's bf16 weights into a
second shared-memory ring, and the two consumer warpgroups only issue wgmmas with both operands in
shared memory, one left in flight (as a dense GEMM does: a dense Triton GEMM reaches cuBLAS at
1024-4096 tokens on this GPU, `bf16_gemm_ceiling.py`). The price: the bf16 tile's store and the
wgmma's A reads add shared-memory traffic a register-A kernel does not have.

Partitions: load warp (TMA activations + weight bytes, scale / min columns: `w4a16_wgmma`'s own),
dequant warpgroup (`_slot_weights`, then STSM into `a_bufs`), two consumers of 64 weight rows each.
Ring slot s is free once the dequant partition has read its bytes and both consumers' wgmmas that
read its activations have retired (`empty` counts 3 arrivals).

Per Llama-3-8B shape and M: cuBLAS bf16 on a dense copy, the shipped map's W4A16 choice, the same
256 x 128 tile in `w4a16_wgmma` (two register-A consumers) and this kernel (checked against the
register-A kernel's output first: same arithmetic per weight, so equal up to summation order).

    PYTHONPATH=. python benchmarks/tc_ablations/wgmma_dq_producer.py --fmt int4p --shapes gate_up,down \
        --m 1024,4096 --variants vecp_s4a2,pair_s4a4,abl2_s4a2,abl3_pair_s4a4 --out $OUT

Stop 40 (H100, `results/wgmma_dq_producer_stop40_run*_*.json`, `results/large_m_w4a16_stop40.md`): the same
bits as the register-A kernel, 1.12x-1.20x its time at its best (two K tiles per producer step). The
wgmmas alone run at cuBLAS's pace; the one producer warpgroup (about 1150 cycles per K tile against the
wgmmas' 1024) holds them back, and a second one does not fit beside m64n256 accumulators. Not kept.
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
    rl: gl.constexpr = gl.SliceLayout(1, bl)
    rows = n0 + gl.arange(0, BN, layout=rl)
    s_rows = s_ptr + rows * (K // G)
    mn_rows = mn_ptr + rows * (K // G)
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
                   WARPS: gl.constexpr, PACKED: gl.constexpr, VEC: gl.constexpr):
    """`_producer` two K tiles at a time (one quantization group: G >= 2 BK): one scale load, one
    proxy fence and one partition barrier per pair, and two independent tiles in flight."""
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    AST: gl.constexpr = a_bufs.type.shape[0]
    BKX: gl.constexpr = a_bufs.type.shape[2]
    bl: gl.constexpr = producer_layout(BN, BKX // 2, WARPS, VEC)
    rl: gl.constexpr = gl.SliceLayout(1, bl)
    rows = n0 + gl.arange(0, BN, layout=rl)
    s_rows = s_ptr + rows * (K // G)
    mn_rows = mn_ptr + rows * (K // G)
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
        w0 = _pair_weights(w_bufs, ready, empty, i0, s2, m2, sc, c, BN, BKX, bl, F16, PACKED)
        w1 = _pair_weights(w_bufs, ready, empty, i0 + 1, s2, m2, sc, c, BN, BKX, bl, F16, PACKED)
        j0 = i0 % AST
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
    acc = warpgroup_mma_wait(0, deps=(acc,))
    mbarrier.arrive(empty.index((num_k - 1) % STAGES))
    mbarrier.arrive(a_empty.index((num_k - 1) % AST))
    W.store_final(acc.to(y_ptr.dtype.element_ty), mma, y_ptr, m0, n0 + ROW0, M, N, WARPS, VEC)


@gluon.jit
def dq_kernel(x_desc, w_desc, s_ptr, mn_ptr, y_ptr, M, N, K, G: gl.constexpr, BN: gl.constexpr,
              STAGES: gl.constexpr, AST: gl.constexpr, BLOCKS: gl.constexpr, F16: gl.constexpr,
              C_REGS: gl.constexpr, num_warps: gl.constexpr, ABL: gl.constexpr = 0, LAG: gl.constexpr = 0,
              PACKED: gl.constexpr = False, VEC: gl.constexpr = False, PAIR: gl.constexpr = False):
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
                              m0, n0, num_k, K, G, BN, BLOCKS, F16, num_warps, PACKED, VEC)),
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
             pair=False):
    m, n, k = x2.shape[0], store.out_features, store.in_features
    if pair and (ast < 4 or ast % 2 or store.group_size % (2 * bk)):
        # with two buffers the pair's second waits for the first's consumers, which wait for the pair
        raise ValueError("pairs need at least 4 (an even number of) A buffers and two K tiles per group")
    y = torch.empty((m, n), device=x2.device, dtype=x2.dtype)
    x_desc, w_desc = W._descriptors(x2, store, bm, bn, bk)
    grid = (n // bn, -(-m // bm))
    dq_kernel[grid](x_desc, w_desc, store.scales, store.mins, y, m, n, k, G=store.group_size, BN=bn, STAGES=stages,
                    AST=ast, BLOCKS=store.layout == BLOCKS16, F16=x2.dtype == torch.float16,
                    C_REGS=c_regs, ABL=abl, LAG=lag, PACKED=packed and W.packed_dequant(store, x2.dtype), VEC=vec, PAIR=pair, num_warps=4,
                    maxnreg=maxnreg)
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
            # timing only: the consumers issue no wgmma (how fast the producer alone runs)
            "abl3_vecp_s4a2": dict(stages=4, ast=2, vec=True, packed=True, abl=3),
            "abl3_pair_s4a4": dict(stages=4, ast=4, vec=True, packed=True, pair=True, abl=3)}


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
                dq_w4a16(x, store, **VARIANTS[a.once])
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
                    y = dq_w4a16(x, store, **VARIANTS[var])
                    torch.cuda.synchronize()
                    err = ((y.float() - y_reg.float()).norm() / y_reg.float().norm()).item()
                    r[f"{var}_err"] = err
                    if not err < 5e-3 and not var.startswith("abl"):
                        r[var] = f"wrong: {err:.3g}"
                        continue
                    r[var] = time_us([lambda: dq_w4a16(x, store, **VARIANTS[var])])
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
