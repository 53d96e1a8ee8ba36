"""Does a TMA multicast of the activation codes pay for W4A8 at large M? (GPU, Triton >= 3.9)

Why: `w4a8_progressive` is bound by moving the token codes from L2 into shared memory, since each
program re-reads its tokens' codes for every BN rows of weights (stop 21: 80% of a 256 x 128 tile's
bytes). Here two CTAs of a cluster take neighbouring weight-row tiles of the same token tile, and CTA 0
loads the codes once for both (`tma.async_load(..., multicast=True)`), which halves the code traffic.

Triton 3.9's Gluon models a cluster with CGA layouts; this kernel keeps every layout replicated over
the cluster (each CTA computes its own tile, its weight rows offset by its cluster rank). The codes ring
needs each CTA's consumer to tell CTA 0 that a slot is free before CTA 0 refills it in both CTAs;
Gluon's `mbarrier.arrive(from_cta=...)` only routes CTA 0's arrivals to every CTA, so CTA 1 arrives on
CTA 0's barrier with inline PTX (`mapa` + `mbarrier.arrive.release.cluster.shared::cluster`; Gluon 3.9's
`gl.inline_asm` passes a barrier as its shared address). Both barriers count two arrivals per phase:
CTA 0's from its own consumer and CTA 1's, CTA 1's from its own consumer twice.

A deliberately plain kernel, the same with and without the cluster (MC = 1 / 2): one consumer
warpgroup (64 weight rows, 128 tokens, int32 accumulator over all K as `w4a8_progressive`), a
one-warp TMA loader, int4-prog blocks16 stores, a simple masked epilogue. It measures what the
multicast changes, not a kernel to ship. Checks each result against the torch reference, then times
MC = 1 and 2 on Llama-3-8B shapes at several M, and the shipped `w4a8_progressive` map pick beside them.

Measured (stop 38, H100, `results/progressive_multicast_*_stop38_*`): correct everywhere, and slower.
On the 256 x 128 tile the cluster launch alone cost 1-5% and the multicast 4-10% against the same kernel
without a cluster (gate_up at 512 tokens: 133.7 -> 146.5 us); a `.release` arrival made it 2-2.5x.

    PYTHONPATH=<triton 3.9>:. TRITON_DEFAULT_FP_FUSION=1 GEARSHIFT_MC_ARRIVE=relaxed \
        python benchmarks/tc_ablations/progressive_multicast.py --ms 256,1024 --tile 256x128 --stages 3,4 --out $OUT
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from gearshift.kernels.w4a8_progressive import _HIGH_HALF, _LOW_HALF, int8_weights

BK = gl.constexpr(128)  # one K tile per quantization group

_RANK = gl.constexpr("mov.u32 $0, %cluster_ctarank;")
# CTA 1's consumer tells CTA 0's barrier (same offset) that a codes slot is free
# (one thread of the consumer warpgroup: the asm runs in every thread)
_ARRIVE_CTA0_FMT = ("{{ .reg .b32 r, t; .reg .pred p, q; mov.u32 t, %tid.x; and.b32 t, t, 127; "
                  "setp.eq.u32 q, t, 0; setp.ne.b32 p, $1, 0; and.pred p, p, q; "
                  "mapa.shared::cluster.u32 r, $0, 0; @p mbarrier.arrive.{sem}.cluster.shared::cluster.b64 _, [r]; }}")
#: the arrival's memory semantics: release (orders this thread's earlier accesses) or relaxed (the slot's
#: reads are already complete: the wgmma was waited for), GEARSHIFT_MC_ARRIVE=relaxed
_ARRIVE_CTA0 = gl.constexpr(_ARRIVE_CTA0_FMT.format(sem=os.environ.get("GEARSHIFT_MC_ARRIVE", "release")))


@gluon.constexpr_function
def _store_each(outputs, inputs):
    """st.global of every element this thread holds (bf16 bits), where its mask is set."""
    ptrs, vals, masks = inputs
    return "\n".join(f"{{ .reg .pred p; setp.ne.b32 p, {m}, 0; @p st.global.b16 [{a}], {v}; }}"
                      for a, v, m in zip(ptrs, vals, masks))


@gluon.constexpr_function
def _cga(rank, mc):
    return [[0] * rank] if mc > 1 else []


@gluon.constexpr_function
def word_layout_mc(BN, BKX, mc):
    """`w4a8_progressive.word_layout` for one 4-warp consumer, replicated over the cluster."""
    reg = [[0, 0, 1], [0, 0, 2], [8, 0, 0]] + [[0, 2 << i, 0] for i in range((BKX // 16).bit_length() - 1)]
    rows = 64
    while rows < BN:
        reg.append([rows, 0, 0])
        rows *= 2
    return gl.DistributedLinearLayout(
        reg_bases=reg, lane_bases=[[0, 0, 4], [0, 1, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=_cga(3, mc), shape=[BN, BKX // 8, 8])


@gluon.constexpr_function
def group_cols_mc(BN, mc):
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [8, 0]], lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=_cga(2, mc), shape=[BN, 8])


@gluon.constexpr_function
def mma_layout_mc(BM, mc):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 32],
                                     cga_layout=_cga(2, mc))


@gluon.constexpr_function
def words_smem_mc(mc):
    return gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32, rank=2, cga_layout=_cga(2, mc))


@gluon.jit
def _cluster_rank(MC: gl.constexpr):
    if MC > 1:
        return gl.inline_asm(_RANK, "=r", [], gl.int32, is_pure=True)
    else:
        return 0


@gluon.jit
def _pick(t, bit):
    a, b = gl.split(gl.reshape(t, [t.shape[0], t.shape[1] // 2, 2]))
    return gl.where(bit, b, a)


@gluon.jit
def _column(buf, j, target: gl.constexpr, BN: gl.constexpr, MC: gl.constexpr):
    t = buf.load(group_cols_mc(BN, MC))
    v = _pick(_pick(_pick(t, (j & 1) != 0), (j & 2) != 0), (j & 4) != 0)
    return gl.convert_layout(gl.reshape(v, [BN]).to(gl.float32), target)


@gluon.jit
def _loader(x_desc, w_desc, sc_desc, mn_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, m0, n0, num_k,
            MC: gl.constexpr, MULTICAST: gl.constexpr):
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    NB: gl.constexpr = (x_desc.block_type.nbytes + w_desc.block_type.nbytes + 2 * sc_desc.block_type.nbytes)
    for i in range(num_k):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), NB)
        tma.async_load(x_desc, [m0, i * BK], ready.index(s), x_bufs.index(s), multicast=MULTICAST)
        tma.async_load(w_desc, [n0 // 16, i * 16, 0], ready.index(s), w_bufs.index(s))
        tma.async_load(sc_desc, [n0, i // 8 * 8], ready.index(s), sc_bufs.index(s))
        tma.async_load(mn_desc, [n0, i // 8 * 8], ready.index(s), mn_bufs.index(s))


@gluon.jit
def _consumer(x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, units_ptr, xs_ptr, y_ptr, m0, n0, M, N, num_k,
              rank, ROW0: gl.constexpr, BN: gl.constexpr, MC: gl.constexpr, COUPLED: gl.constexpr):
    """Weight rows [ROW0, ROW0 + BN) of the CTA's tile (one 4-warp consumer); BM = 256 runs two
    m64n128 wgmmas on the same A registers, as `w4a8_progressive`."""
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    BM: gl.constexpr = x_bufs.type.shape[1]
    BMH: gl.constexpr = 128 if BM > 128 else BM
    mma: gl.constexpr = mma_layout_mc(BMH, MC)
    dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    wl3: gl.constexpr = word_layout_mc(BN, BK, MC)
    wl: gl.constexpr = gl.SliceLayout(2, wl3)
    zeros3 = gl.zeros([BN, BK // 8, 8], gl.int32, layout=wl3)
    zeros = gl.reshape(zeros3, [BN, BK])
    rows: gl.constexpr = gl.SliceLayout(1, zeros.type.layout)
    j8 = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(0, wl3)))
    kk = gl.reshape(gl.expand_dims(gl.expand_dims(j8, 0), 0) + zeros3, [BN, BK])
    sel = gl.where((kk & 4) != 0, _HIGH_HALF, _LOW_HALF) + zeros
    inv = 1.0 / gl.load(units_ptr + n0 + ROW0 + gl.arange(0, BN, layout=rows))
    acc = gl.zeros([BN, BMH], gl.int32, layout=mma)
    acc2 = gl.zeros([BN, BMH], gl.int32, layout=mma)
    NROWS: gl.constexpr = w_bufs.type.shape[1] * 16
    for i in range(num_k):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        t = (_column(sc_bufs.index(s).slice(ROW0, BN), i % 8, rows, BN, MC) * inv).to(gl.int32)
        c = ((_column(mn_bufs.index(s).slice(ROW0, BN), i % 8, rows, BN, MC) * inv).to(gl.int32) + 256) * 65537
        wsm = w_bufs.index(s).reshape([NROWS, BK // 2]).reinterpret(gl.int32, [NROWS, BK // 8], words_smem_mc(MC))
        w = wsm.slice(ROW0, BN).load(wl)
        wb = gl.reshape(gl.expand_dims(w, 2) + zeros3, [BN, BK])
        a = gl.convert_layout(int8_weights(wb, sel, t[:, None], c[:, None]), dot, assert_trivial=True)
        if BM > 128:
            acc = warpgroup_mma(a, x_bufs.index(s).slice(0, BMH).permute((1, 0)), acc, is_async=True)
            acc2 = warpgroup_mma(a, x_bufs.index(s).slice(BMH, BMH).permute((1, 0)), acc2, is_async=True)
            acc, acc2 = warpgroup_mma_wait(0, deps=(acc, acc2))
        else:
            acc = warpgroup_mma(a, x_bufs.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index(s))
        if COUPLED:
            mbarrier.arrive(empty.index(s), pred=rank == 1)  # CTA 1's barrier counts two as CTA 0's does
            gl.inline_asm(_ARRIVE_CTA0, "r,r", [empty.index(s), ((rank == 1) & (i < num_k - STAGES)).to(gl.int32)],
                          (), is_pure=False)
    _epilogue(acc, mma, units_ptr, xs_ptr, y_ptr, m0, n0 + ROW0, M, N, MC)
    if BM > 128:
        _epilogue(acc2, mma, units_ptr, xs_ptr, y_ptr, m0 + BMH, n0 + ROW0, M, N, MC)


@gluon.jit
def _epilogue(acc, mma: gl.constexpr, units_ptr, xs_ptr, y_ptr, m0, n0, M, N, MC: gl.constexpr):
    BN: gl.constexpr = acc.type.shape[0]
    BMH: gl.constexpr = acc.type.shape[1]
    unit = gl.load(units_ptr + n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, mma)))
    offs_m = m0 + gl.arange(0, BMH, layout=gl.SliceLayout(0, mma))
    offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
    out = acc.to(gl.float32) * unit[:, None] * gl.load(xs_ptr + offs_m, mask=offs_m < M, other=0.0)[None, :]
    ptrs = y_ptr + offs_m[None, :] * N + offs_n[:, None]
    mask = (offs_m < M)[None, :] & (offs_n < N)[:, None]
    if MC > 1:  # a store of a cluster-replicated tensor is left to CTA 0 alone: every CTA stores its own
        vals = out.to(gl.bfloat16).to(gl.int16, bitcast=True)
        gl.inline_asm(_store_each, ("l", "h", "r"), [ptrs, vals, mask.to(gl.int32)], (), is_pure=False)
    else:
        gl.store(ptrs, out.to(y_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def mc_kernel(x_desc, w_desc, sc_desc, mn_desc, units_ptr, xs_ptr, y_ptr, M, N, K, STAGES: gl.constexpr,
              MC: gl.constexpr, MULTICAST: gl.constexpr, COUPLED: gl.constexpr, CONSUMERS: gl.constexpr):
    BM: gl.constexpr = x_desc.block_type.shape[0]
    BN: gl.constexpr = sc_desc.block_type.shape[0]
    HALF: gl.constexpr = BN // CONSUMERS
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    sc_bufs = gl.allocate_shared_memory(gl.float16, [STAGES, BN, 8], sc_desc.layout)
    mn_bufs = gl.allocate_shared_memory(gl.float16, [STAGES, BN, 8], mn_desc.layout)
    if MC > 1:
        ready = mbarrier.allocate_mbarrier(batch=STAGES)
        empty = mbarrier.allocate_mbarrier(batch=STAGES)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=2 * CONSUMERS if COUPLED else CONSUMERS)
    else:
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=CONSUMERS)
    rank = _cluster_rank(MC)
    m0 = gl.program_id(1) * BM
    n0 = (gl.program_id(0) * MC + rank) * BN
    num_k = K // BK
    if CONSUMERS == 1:
        gl.warp_specialize([
            (_consumer, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, units_ptr, xs_ptr, y_ptr, m0, n0, M, N,
                         num_k, rank, 0, BN, MC, COUPLED)),
            (_loader, (x_desc, w_desc, sc_desc, mn_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, m0, n0,
                       num_k, MC, MULTICAST)),
        ], [1], [40])
    else:
        gl.warp_specialize([
            (_consumer, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, units_ptr, xs_ptr, y_ptr, m0, n0, M, N,
                         num_k, rank, 0, HALF, MC, COUPLED)),
            (_consumer, (x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, units_ptr, xs_ptr, y_ptr, m0, n0, M, N,
                         num_k, rank, HALF, HALF, MC, COUPLED)),
            (_loader, (x_desc, w_desc, sc_desc, mn_desc, x_bufs, w_bufs, sc_bufs, mn_bufs, ready, empty, m0, n0,
                       num_k, MC, MULTICAST)),
        ], [4, 1], [232, 40])


def descriptors(codes, store, bm: int, bn: int, mc: int):
    """TMA descriptors of the codes [M, K] (a [bm, 128] box), the blocks16 weight bytes and the
    fp16 scale / min boxes [bn, 8], with layouts replicated over an mc-CTA cluster."""
    cga2 = [[0, 0]] if mc > 1 else []
    cga3 = [[0, 0, 0]] if mc > 1 else []
    n, k = store.out_features, store.in_features
    xl = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2, cga_layout=cga2)
    wl = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=3, cga_layout=cga3)
    sl = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2, cga_layout=cga2)
    return (TensorDescriptor.from_tensor(codes, [bm, int(BK)], xl),
            TensorDescriptor.from_tensor(store.qweight.view(n // 16, (k // 128) * 16, 64), [bn // 16, 16, int(BK) // 2], wl),
            TensorDescriptor.from_tensor(store.scales, [bn, 8], sl),
            TensorDescriptor.from_tensor(store.mins, [bn, 8], sl))


def run(codes, scales, store, mc: int, bm: int = 128, bn: int = 64, stages: int = 4, out_dtype=torch.bfloat16,
        multicast: bool = True, coupled: bool = True):
    """mc = 2: a 2-CTA cluster per pair of row tiles; multicast=False loads the codes in each CTA
    (the cluster's cost without its saving); coupled=False (only without multicast) also drops
    the cross-CTA slot release, so the two CTAs share nothing but the launch."""
    m, n, k = codes.shape[0], store.out_features, store.in_features
    y = torch.empty((m, n), device=codes.device, dtype=out_dtype)
    xd, wd, sd, md = descriptors(codes, store, bm, bn, mc)
    grid = (n // (bn * mc), triton.cdiv(m, bm))
    mc_kernel[grid](xd, wd, sd, md, store.row_units, scales, y, m, n, k, STAGES=stages, MC=mc,
                    MULTICAST=mc > 1 and multicast, COUPLED=mc > 1 and (multicast or coupled), CONSUMERS=bn // 64,
                    num_warps=4, num_ctas=mc)
    return y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="256,512,1024")
    ap.add_argument("--stages", default="4")
    ap.add_argument("--shapes", default="qkv,o,gate_up,down")
    ap.add_argument("--tile", default="256x128", help="BMxBN: tokens x weight rows per CTA (BN / 64 consumers)")
    ap.add_argument("--variants", default="plain,free,cluster,multicast,shipped")
    ap.add_argument("--reps", type=int, default=5, help="timed graph replays (1 for a profiler run)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    from gearshift.dispatch.profiler import random_store
    from gearshift.kernels.act_quant import quantize_act_triton
    from gearshift.kernels.reference import linear_reference
    from gearshift.kernels.w4a8_progressive import progressive_codes
    from gearshift.quant.modes import MODES
    from gearshift.dispatch.policy import load_policy_for_device, type_key

    dev = torch.device("cuda")
    act = MODES["w4a8"].act
    pm = load_policy_for_device()
    shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
    rows = []
    shapes = {s: shapes[s] for s in args.shapes.split(",")}
    keep = set(args.variants.split(","))
    bm, bn = map(int, args.tile.split("x"))
    for name, (n, k) in shapes.items():
        copies = max(2, int(2 * 50e6 // (n * k // 2)) + 1)  # past L2
        stores = [random_store("int4p", n, k, 128, dev, layout="blocks16") for _ in range(copies)]
        for m in map(int, args.ms.split(",")):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            codes, scales = quantize_act_triton(x, act)
            ref = linear_reference(x, stores[0], act)
            entry = pm.lookup(type_key("w4a8", 128, n, k), m) if pm is not None else None
            variants = [(f"{lab}_s{st}", lambda s, mc=mc, mcast=mcast, cp=cp, st=st: run(
                            codes, scales, s, mc, bm=bm, bn=bn, stages=st, multicast=mcast, coupled=cp))
                        for lab, mc, mcast, cp in (("plain", 1, False, False), ("free", 2, False, False),
                                                   ("cluster", 2, False, True), ("multicast", 2, True, True))
                        for st in map(int, args.stages.split(","))]
            if entry is not None and entry.strategy == "w4a8_progressive":
                variants.append(("shipped", lambda s: progressive_codes(codes, scales, s, entry.config, x.dtype)))
            variants = [(label, fn) for label, fn in variants if label.split("_")[0] in keep]
            for label, fn in variants:
                try:
                    y = fn(stores[0])
                    torch.cuda.synchronize()
                    err = float((y.float() - ref.float()).norm() / ref.float().norm())
                except Exception as e:  # noqa: BLE001 - an experiment: report and go on
                    rows.append({"shape": name, "m": m, "variant": label, "error": f"{type(e).__name__}: {e}"[:300]})
                    print(name, m, label, "FAILED", rows[-1]["error"][:200], flush=True)
                    continue
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for s in stores:
                        fn(s)
                g.replay()
                torch.cuda.synchronize()
                times = []
                for _ in range(args.reps):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    g.replay()
                    b.record()
                    torch.cuda.synchronize()
                    times.append(a.elapsed_time(b) * 1e3 / len(stores))
                us = sorted(times)[len(times) // 2]
                rows.append({"shape": name, "m": m, "variant": label, "us": us, "rel_err": err})
                print(f"{name:8s} M={m:5d} {label:10s} {us:8.2f} us  err {err:.2e}", flush=True)
    dev_name = torch.cuda.get_device_name().replace(" ", "_")
    with open(os.path.join(args.out, f"progressive_multicast_{dev_name}_stop38.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "triton": triton.__version__, "tile": args.tile,
                   "arrive": os.environ.get("GEARSHIFT_MC_ARRIVE", "release"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
