"""Bit-exactness of `w4a8_progressive` against its emulation on a subset of tiles (--check), then its time on the
large shapes (GPU). Stop 21 ran it on the shipped kernel and with `results/progressive_scale_ring.patch`
applied (scale boxes in a ring of their own, loaded once per 8 K tiles): the patch was slower.

    PYTHONPATH=. python benchmarks/tc_ablations/scale_ring_check.py LABEL OUT.json [--check]
"""
import json
import sys
import time

import torch

from gearshift.dispatch.profiler import n_copies, random_store, time_us
from gearshift.kernels.act_quant import quantize_act_triton
from gearshift.kernels import w4a8_progressive as P
from gearshift.kernels.config import TileConfig
from gearshift.quant.activations import ActQuantSpec
from gearshift.quant.int4 import BLOCKS16

def cfg(bm, bn, w, st, r, sk):
    return TileConfig(bm, bn, 128, sk, w, st, maxnreg=r)

check = "--check" in sys.argv
res = {}
if check:
    t = time.time()
    subset = [(64, 64, 4, 6, 128, 1), (64, 64, 4, 4, 128, 4), (128, 64, 4, 4, 0, 2), (128, 128, 8, 4, 0, 1),
              (128, 256, 8, 4, 0, 1), (256, 128, 8, 3, 0, 1), (256, 64, 4, 4, 0, 2), (256, 128, 8, 3, 0, 2)]
    bad = 0
    for n, k in ((384, 2048), (256, 14336)):
        st = random_store("int4p", n, k, 128, "cuda", layout=BLOCKS16)
        for act in (ActQuantSpec("int8"), ActQuantSpec("int4")):
            for m in (64, 300):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                codes, scales = quantize_act_triton(x, act)
                for c in map(lambda a: cfg(*a), subset):
                    if c.bm > max(64, m) or not P.progressive_supports(st, act, c):
                        continue
                    emu = P.w4a8_progressive_emulate(codes, scales, st, torch.float32, c.split_k)
                    y = P.progressive_codes(codes, scales, st, c, torch.float32)
                    ok = torch.equal(y, emu)
                    bad += not ok
                    if not ok:
                        print("MISMATCH", n, k, act.dtype, m, c.key(), (y - emu).abs().max().item(), flush=True)
    print(f"check: {bad} mismatches, {time.time()-t:.0f}s", flush=True)
    res["mismatches"] = bad
    if bad:
        sys.exit(1)
shapes = {"gate_up": (28672, 4096), "down": (4096, 14336), "qkv": (6144, 4096), "o": (4096, 4096)}
runs = [("gate_up", 4096, (256, 128, 8, 3, 0, 1)), ("down", 4096, (256, 128, 8, 3, 0, 1)),
        ("gate_up", 256, (256, 128, 8, 4, 0, 1)), ("down", 256, (128, 64, 4, 4, 0, 1)),
        ("qkv", 4096, (256, 128, 8, 3, 0, 1)), ("o", 256, (128, 64, 4, 4, 0, 1))]
act = ActQuantSpec("int8")
for name, m, c in runs:
    n, k = shapes[name]
    st0 = random_store("int4p", n, k, 128, "cuda", layout=BLOCKS16)
    copies = [st0] + [random_store("int4p", n, k, 128, "cuda", layout=BLOCKS16) for _ in range(n_copies(st0) - 1)]
    codes, scales = quantize_act_triton(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), act)
    cc = cfg(*c)
    us = time_us([lambda s=s: P.progressive_codes(codes, scales, s, cc, torch.bfloat16) for s in copies])
    res[f"{name}@{m}"] = us
    print(f"{sys.argv[1]} {name} M={m} {cc.key()} {us:.1f} us", flush=True)
    del copies, st0
    torch.cuda.empty_cache()
json.dump(res, open(sys.argv[2], "w"), indent=1)
