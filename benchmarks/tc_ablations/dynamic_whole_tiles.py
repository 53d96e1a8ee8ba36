"""Hybrid stream-K progressive tiles (256 x 128): whole tiles split statically (p, p + P, ..) against
drawn one at a time from a counter, and the map's tile, per Llama shape and M (GPU; stop 29).

Needs `results/dynamic_whole_tiles.patch` applied first (`git apply`; it adds the counter draw and
the `PROGRESSIVE_DYNAMIC` switch; not kept, see docs/kernels_history.md "Stop 29"). Checks that the drawn
and the static split give the same bits and that reruns reproduce (the counters reset).

    git apply benchmarks/results/dynamic_whole_tiles.patch
    OUT=. PYTHONPATH=. python benchmarks/tc_ablations/dynamic_whole_tiles.py
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
HY = TileConfig(256, 128, 128, 1, 8, 3, stream_k=1, hybrid=True)
rows = []
for name, (n, k) in SH.items():
    st0 = random_store("int4p", n, k, 128, "cuda", layout="blocks16")
    stores = [st0] + [random_store("int4p", n, k, 128, "cuda", layout="blocks16") for _ in range(n_copies(st0) - 1)]
    for m in (512, 1024, 2048, 4096):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        c, xs = quantize_act_triton(x, ActQuantSpec("int8"))
        dp = TileConfig.from_dict(mp[f"w4a8:g128:{n}x{k}"][str(m)]["config"])
        r = {"shape": name, "m": m, "map_cfg": dp.to_dict()}
        outs = {}
        for label, cfg, dyn in (("map", dp, False), ("hybrid_static", HY, False), ("hybrid_dyn", HY, True)):
            P.PROGRESSIVE_DYNAMIC = dyn
            outs[label] = P.progressive_codes(c, xs, st0, cfg, torch.bfloat16)
            for _ in range(3):  # reruns reproduce (counters reset)
                assert torch.equal(P.progressive_codes(c, xs, st0, cfg, torch.bfloat16), outs[label]), label
            r[label] = time_us([lambda s=s, cfg=cfg: P.progressive_codes(c, xs, s, cfg, torch.bfloat16) for s in stores])
        P.PROGRESSIVE_DYNAMIC = False
        r["dyn_same_bits_as_static"] = torch.equal(outs["hybrid_dyn"], outs["hybrid_static"])
        # (the hybrid's leftover tiles are split over K, so its bits differ from a grid's there)
        r["dyn_same_bits_as_map"] = (torch.equal(outs["hybrid_dyn"], outs["map"])
                                     if dp.split_k == 1 and not dp.stream_k else None)
        rows.append(r)
        print(f"{name:8s} M={m:5d} map {r['map']:8.1f} static {r['hybrid_static']:8.1f} dyn {r['hybrid_dyn']:8.1f} "
              f"same {r['dyn_same_bits_as_static']} {r['dyn_same_bits_as_map']}", flush=True)
out = os.environ.get("OUT", ".")
json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(f"{out}/dyn_tiles_stop29.json", "w"), indent=1)
