"""`w4a16_wgmma` tiles with A through shared memory, now that their wgmmas pipeline (the first K tile
peeled off the loop: stop 29), against the shipped map's choice, per Llama shape and M, on plain
int4 and int4-prog stores (GPU). Each a_smem tile is checked bit-identical to the same tile with A
in registers.

    OUT=. PYTHONPATH=. python benchmarks/tc_ablations/wgmma_a_smem.py
"""
import json
import os

import torch

import gearshift.kernels.w4a16_wgmma as W
from gearshift.dispatch.dispatcher import AdaptiveDispatcher
from gearshift.dispatch.policy import PolicyMap
from gearshift.dispatch.profiler import n_copies, random_store, time_us
from gearshift.kernels.config import TileConfig

SH = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
MAP = "gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json"
d = AdaptiveDispatcher(PolicyMap.load(MAP), autoload=False)
TILES = [(64, 64, 4, 6, 128, 64), (128, 64, 4, 4, 128, 64), (128, 64, 4, 3, 128, 64), (256, 128, 8, 3, 0, 64),
         (256, 64, 4, 4, 0, 64), (128, 128, 8, 4, 0, 64), (64, 64, 4, 4, 128, 128), (128, 64, 4, 3, 128, 128),
         (256, 64, 4, 3, 0, 128)]
rows = []
for fmt in ("int4", "int4p"):
    for name, (n, k) in SH.items():
        st0 = random_store(fmt, n, k, 128, "cuda", layout="blocks16")
        stores = [st0] + [random_store(fmt, n, k, 128, "cuda", layout="blocks16") for _ in range(n_copies(st0) - 1)]
        for m in (128, 256, 512, 1024, 4096):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            r = {"fmt": fmt, "shape": name, "m": m, "map_choice": str(d.choose(st0, None, m))}
            r["map_us"] = time_us([lambda s=s: d.linear(x, s, None) for s in stores])
            best = None
            for bm, bn, w, stg, reg, bk in TILES:
                for sk in (1, 2):
                    cfg = TileConfig(bm, bn, bk, sk, w, stg, a_smem=True, maxnreg=reg)
                    if bm > max(64, m) or not W.wgmma_supports(st0, cfg, torch.bfloat16):
                        continue
                    try:
                        y = W.w4a16_wgmma(x, st0, cfg)
                    except Exception as e:  # noqa: BLE001
                        print("FAILED", cfg, str(e)[:100], flush=True)
                        continue
                    ref = W.w4a16_wgmma(x, st0, TileConfig(bm, bn, bk, sk, w, stg, maxnreg=reg))
                    same = torch.equal(y, ref)
                    if not same:
                        print("MISMATCH", fmt, name, m, cfg, flush=True)
                    t = time_us([lambda s=s, cfg=cfg: W.w4a16_wgmma(x, s, cfg) for s in stores])
                    r[str(cfg)] = {"us": t, "same_bits_as_register_a": same}
                    if best is None or t < best[0]:
                        best = (t, f"{bm}x{bn}w{w}s{stg}k{sk}b{bk}")
            r["best_a_smem"] = best
            rows.append(r)
            print(f"{fmt:5s} {name:8s} M={m:5d} map {r['map_us']:8.1f}  best a_smem {best[0] if best else 0:8.1f} "
                  f"{best[1] if best else ''}", flush=True)
out = os.environ.get("OUT", ".")
json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(f"{out}/a_smem16_stop29.json", "w"), indent=1)
