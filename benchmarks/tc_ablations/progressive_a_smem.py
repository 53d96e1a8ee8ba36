"""`w4a8_progressive` with its int8 weight tile through shared memory (one wgmma group left in flight
while the next tile is built) against the register-A kernel, per Llama shape and M (GPU; stop 29).

Needs `results/progressive_a_smem.patch` applied first (`git apply`; not kept: 0.8-1.26x slower on
all but two small shapes, docs/kernels_history.md "Stop 29"). Each a_smem tile is checked bit-identical to
the same tile with A in registers.

    git apply benchmarks/results/progressive_a_smem.patch
    OUT=. PYTHONPATH=. python benchmarks/tc_ablations/progressive_a_smem.py
"""
import json
import os

import torch

import gearshift.kernels.w4a8_progressive as P
from gearshift.dispatch.profiler import n_copies, random_store, time_us
from gearshift.kernels.act_quant import quantize_act_triton
from gearshift.kernels.config import TileConfig
from gearshift.quant.activations import ActQuantSpec

SH = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
mp = json.load(open("gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json"))["entries"]
TILES = [(256, 128, 8, 3), (256, 128, 8, 2), (128, 256, 8, 3), (128, 256, 8, 4), (256, 64, 4, 4), (128, 128, 8, 4),
         (128, 64, 4, 4), (64, 128, 8, 4), (64, 64, 4, 6)]
act = ActQuantSpec("int8")
rows = []
for name, (n, k) in SH.items():
    st0 = random_store("int4p", n, k, 128, "cuda", layout="blocks16")
    stores = [st0] + [random_store("int4p", n, k, 128, "cuda", layout="blocks16") for _ in range(n_copies(st0) - 1)]
    for m in (256, 512, 1024, 2048, 4096):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        c, xs = quantize_act_triton(x, act)
        mc = TileConfig.from_dict(mp[f"w4a8:g128:{n}x{k}"][str(m)]["config"])
        r = {"shape": name, "m": m, "map_cfg": mc.to_dict()}
        r["map_us"] = time_us([lambda s=s: P.progressive_codes(c, xs, s, mc, torch.bfloat16) for s in stores])
        best = None
        for bm, bn, w, stg in TILES:
            for sk in (1, 2):
                cfg = TileConfig(bm, bn, 128, sk, w, stg, a_smem=True)
                if bm > max(64, m) or not P.progressive_supports(st0, act, cfg):
                    continue
                ref = P.progressive_codes(c, xs, st0, TileConfig(bm, bn, 128, sk, w, stg), torch.bfloat16)
                try:
                    y = P.progressive_codes(c, xs, st0, cfg, torch.bfloat16)
                except Exception as e:  # noqa: BLE001
                    print("FAILED", cfg, str(e)[:100], flush=True)
                    continue
                same = torch.equal(y, ref)
                t = time_us([lambda s=s, cfg=cfg: P.progressive_codes(c, xs, s, cfg, torch.bfloat16) for s in stores])
                r[str(cfg)] = {"us": t, "same_bits_as_register_a": same}
                if not same:
                    print("MISMATCH", name, m, cfg, flush=True)
                if best is None or t < best[0]:
                    best = (t, f"{bm}x{bn}w{w}s{stg}k{sk}")
        r["best_a_smem"] = best
        rows.append(r)
        print(f"{name:8s} M={m:5d} map {r['map_us']:8.1f}  best a_smem {best[0]:8.1f} {best[1]}", flush=True)
out = os.environ.get("OUT", ".")
json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(f"{out}/a_smem_stop29.json", "w"), indent=1)
