"""Large-M W4A16 / W4A8 conversion variants (variants.py) against cuBLAS bf16 on the Llama-3-8B
shapes: do_bench medians with L2 flushed, best tile per shape, summed over 32 layers.
Usage on the GPU: PYTHONPATH=. TAG=tc_conversions python benchmarks/tc_ablations/conversions.py
(MS=64,256,... PART=a16,a8 A16V=... narrow it); writes $OUT/$TAG.json, prints per-step ms.
Results: benchmarks/results/tc_conversions_*.json; summary in docs/kernels_history.md (stop 11).
"""
import argparse, json, os, sys, time
import torch, triton
sys.path.insert(0, os.path.dirname(__file__))
import variants as exp16
from gearshift.quant.int4 import quantize_int4
from gearshift.quant.activations import ActQuantSpec
from gearshift.kernels.act_quant import quantize_act_triton
from triton.testing import do_bench

from gearshift.dispatch.profiler import PRESETS

argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
torch.manual_seed(0)
dev = "cuda"
SHAPES = {name: (n, k) for name, n, k in PRESETS["llama3-8b"]["shapes"]}
MS = [int(m) for m in os.environ.get("MS", "64,256,1024,4096").split(",")]
PART = os.environ.get("PART", "a16,a8")
stores, dense = {}, {}
for name, (n, k) in SHAPES.items():
    w = torch.randn(n, k, device=dev) * 0.02
    stores[name] = quantize_int4(w, 128)
    dense[name] = stores[name].dequantize(torch.bfloat16)
    del w

def bench(fn):
    return do_bench(fn, warmup=10, rep=40, return_mode="median")


def measure(label, fn, ref):
    """(relative error vs ref, median ms) of fn, which writes into the y it closes over; (None, None)
    if it does not compile or run."""
    try:
        y = fn()
        return ((y.float() - ref).norm() / ref.norm()).item(), bench(fn)
    except Exception as e:
        print("fail", label, str(e)[-200:])
        return None, None

A16_CFGS = [(128, 128, 128, 8, 3), (256, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 128, 128, 4, 4), (128, 128, 64, 4, 4), (128, 128, 128, 8, 4), (128, 256, 128, 8, 3), (256, 128, 64, 8, 4),
            (256, 128, 128, 8, 2), (64, 64, 128, 4, 4)]
A8_CFGS = [(128, 128, 128, 8, 3), (256, 128, 128, 8, 3), (128, 256, 128, 8, 3), (64, 128, 128, 4, 4), (128, 128, 128, 4, 4)]
A16_VARS = [(v, c, sa, pf) for v, c, sa, pf in [("conv0", 0, 0, 0), ("conv0pf", 0, 0, 1), ("conv2pf", 2, 0, 1), ("conv4pf", 4, 0, 1), ("conv5pf", 5, 0, 1), ("sapf", 0, 1, 1)] if v in os.environ.get("A16V", v)]
A8_VARS = [("i8magic_pre", 0, 1, 1, 1, 0), ("i8magic_pre_pf", 0, 1, 1, 1, 1), ("i8magic_pre_perm_pf", 0, 1, 1, 0, 1),
           ("fp8", 1, 0, 0, 1, 0), ("fp8_pf", 1, 0, 0, 1, 1), ("fp8_pre_pf", 1, 1, 0, 1, 1), ("fp8_pre_perm_pf", 1, 1, 0, 0, 1)]

def perm_k(x, bk):
    m, k = x.shape
    return x.view(m, k // bk, bk // 2, 2).transpose(-1, -2).reshape(m, k).contiguous()

def run16(x, st, cfg, conv, sa, pf, y, xp):
    bm, bn, bk, w, s = cfg
    n, k = st.out_features, st.in_features
    grid = (triton.cdiv(n, bn), triton.cdiv(x.shape[0], bm))
    exp16.w4a16_tc2[grid](xp if conv == 5 else x, st.qweight, st.scales, st.mins, y, x.shape[0], n, k, x.stride(0), y.stride(0),
                          G=128, BM=bm, BN=bn, BK=bk, CONV=conv, SA=sa, GROUP=8, PF=pf, num_warps=w, num_stages=s)

def run8(xq, xs, xsum, st, cfg, fp8, pre, magic, join, pf, y):
    bm, bn, bk, w, s = cfg
    n, k = st.out_features, st.in_features
    grid = (triton.cdiv(n, bn), triton.cdiv(xq.shape[0], bm))
    exp16.w4a8_tc2[grid](xq, xs, xsum, st.qweight, st.scales, st.mins, y, xq.shape[0], n, k, xq.stride(0), y.stride(0),
                         G=128, BM=bm, BN=bn, BK=bk, FP8=fp8, PRE_SUM=pre, MAGIC=magic, JOIN=join, GROUP=8, PF=pf,
                         num_warps=w, num_stages=s)

res = {"device": torch.cuda.get_device_name(), "a16": {}, "a8": {}, "cublas": {}, "err": {}}
t0 = time.time()
for m in MS:
    for name, st in stores.items():
        n, k = st.out_features, st.in_features
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        res["cublas"][f"{name}:{m}"] = bench(lambda: torch.matmul(x, dense[name].T))
        ref = (x.float() @ st.dequantize(torch.float32).T)
        y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        if "a16" in PART:
            for vname, conv, sa, pf in A16_VARS:
                for cfg in A16_CFGS:
                    if cfg[0] > max(64, m) or (cfg[0] > 64 and m <= 64):
                        continue
                    xp = perm_k(x, cfg[2]) if conv == 5 else x
                    err, t = measure((vname, cfg), lambda: run16(x, st, cfg, conv, sa, pf, y, xp) or y, ref)
                    res["a16"][f"{vname}|{cfg}|{name}:{m}"] = t
                    if name == "qkv":
                        res["err"][f"a16|{vname}|{cfg}|{m}"] = err
        if "a8" in PART:
            for fp8 in (0, 1):
                spec = ActQuantSpec(dtype="fp8" if fp8 else "int8")
                xq, xs = quantize_act_triton(x, spec)
                xqf = xq.float()
                xsum = xqf.view(m, k // 128, 128).sum(-1).contiguous()
                ref8 = (xqf * xs[:, None]) @ st.dequantize(torch.float32).T
                xq8 = xq.view(torch.uint8) if fp8 else xq
                xperm = perm_k(xq8, 128)
                for vname, vf, pre, magic, join, pf in A8_VARS:
                    if vf != fp8:
                        continue
                    for cfg in A8_CFGS:
                        if cfg[0] > max(64, m) or (cfg[0] > 64 and m <= 64):
                            continue
                        xin = xq8 if join else xperm
                        err, t = measure((vname, cfg), lambda: run8(xin, xs, xsum, st, cfg, fp8, pre, magic, join, pf,
                                                                    y) or y, ref8)
                        res["a8"][f"{vname}|{cfg}|{name}:{m}"] = t
                        if name == "qkv":
                            res["err"][f"a8|{vname}|{cfg}|{m}"] = err
    print(f"M={m} done {time.time()-t0:.0f}s", flush=True)
    json.dump(res, open(os.path.join(os.environ.get("OUT", "."), os.environ.get("TAG", "tc2") + ".json"), "w"), indent=1)

# summary: per M, per variant: best config per shape, summed x32 (ms)
def step(table, vname, m):
    tot = 0.0
    for name in SHAPES:
        ts = [v for kk, v in table.items() if kk.startswith(vname + "|") and kk.endswith(f"|{name}:{m}") and v]
        if not ts:
            return None
        tot += min(ts)
    return 32 * tot
print("M | cublas | " + " | ".join(v[0] for v in A16_VARS) + " || " + " | ".join(v[0] for v in A8_VARS))
for m in MS:
    cb = 32 * sum(res["cublas"][f"{n}:{m}"] for n in SHAPES)
    a = [step(res["a16"], v[0], m) for v in A16_VARS]
    b = [step(res["a8"], v[0], m) for v in A8_VARS]
    f = lambda v: "-" if v is None else f"{v:.2f}"
    print(f"{m} | {cb:.2f} | " + " | ".join(map(f, a)) + " || " + " | ".join(map(f, b)))
errs = {k: v for k, v in res["err"].items() if v is None or v > 1e-2}
print("large errors:", list(errs.items())[:10])
print("max err a16", max((v for k, v in res["err"].items() if k.startswith("a16") and v), default=None),
      "a8", max((v for k, v in res["err"].items() if k.startswith("a8") and v), default=None))
