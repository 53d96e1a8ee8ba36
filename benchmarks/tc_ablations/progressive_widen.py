"""`w4a8_progressive` with the int8 weight build in a 4-warp partition of its own (load warp ->
bytes ring -> widening warps -> int8 weight ring in shared memory -> consumers that only issue
wgmmas, one K tile in flight) against the register-A kernel, per Llama shape and M (GPU; stop 32).

Needs `results/progressive_widen.patch` applied first (`git apply`; not kept: never faster than
the map's register-A tile, 1.0-1.5x slower; docs/kernels_history.md "Stop 32"). The patch adds the
`a_smem` progressive tiles (`TileConfig.a_smem`) to the profiler's list too. Each one is checked
bit-identical to the register-A tile of the same shape. SMEM_RB / WREGS set the rows the widening
warps build at a time and their register caps (one consumer, two consumers).

    git apply benchmarks/results/progressive_widen.patch
    OUT=. PYTHONPATH=. python benchmarks/tc_ablations/progressive_widen.py 256,512
"""
import dataclasses
import json
import os
import sys
import time

import torch

from gearshift.dispatch.profiler import PRESETS, random_store, time_us
from gearshift.kernels import w4a8_progressive as P
from gearshift.kernels.act_quant import quantize_act_triton
from gearshift.kernels.config import TileConfig
from gearshift.quant.activations import ActQuantSpec

if os.environ.get("SMEM_RB"):
    P.SMEM_BUILD_ROWS = int(os.environ["SMEM_RB"])
if os.environ.get("WREGS"):
    P.WIDEN_REGS = tuple(int(v) for v in os.environ["WREGS"].split(","))
TAG = os.environ.get("TAG", "")
SHAPES = {name: (n, k) for name, n, k in PRESETS["llama3-8b"]["shapes"]}
ACT = ActQuantSpec("int8")


def main() -> None:
    ms = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "256,512").split(",")]
    shipped = json.load(open("gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json"))["entries"]
    rows, bad, t0 = [], 0, time.time()
    for name, (n, k) in SHAPES.items():
        store = random_store("int4p", n, k, 128, "cuda", layout="blocks16")
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            codes, xs = quantize_act_triton(x, ACT)
            mp = TileConfig.from_dict(shipped[f"w4a8:g128:{n}x{k}"][str(m)]["config"])
            r = {"shape": name, "m": m, "map_cfg": mp.key(),
                 "map_us": time_us([lambda: P.progressive_codes(codes, xs, store, mp, torch.bfloat16)])}
            for cfg in P.progressive_configs(m):
                if not cfg.a_smem or not P.progressive_supports(store, ACT, cfg):
                    continue
                ref = dataclasses.replace(cfg, a_smem=False, maxnreg=0)
                try:
                    y = P.progressive_codes(codes, xs, store, cfg, torch.bfloat16)
                    same = None
                    if P.progressive_supports(store, ACT, ref):
                        same = bool(torch.equal(y, P.progressive_codes(codes, xs, store, ref, torch.bfloat16)))
                    bad += same is False
                    us = time_us([lambda: P.progressive_codes(codes, xs, store, cfg, torch.bfloat16)])
                    r[cfg.key()] = {"us": us, "same_bits": same}
                except Exception as e:  # noqa: BLE001 - report the tile, keep going
                    r[cfg.key()] = {"error": str(e)[:300]}
            rows.append(r)
            timed = {kk: v for kk, v in r.items() if isinstance(v, dict) and "us" in v}
            best = min(timed, key=lambda kk: timed[kk]["us"], default=None)
            print(f"{name:8s} M={m:4d} map {r['map_us']:7.1f} us, best a_smem {best} "
                  f"{timed[best]['us'] if best else float('nan'):.1f} us", flush=True)
    out = os.environ.get("OUT", ".")
    json.dump({"device": torch.cuda.get_device_name(), "rows": rows},
              open(f"{out}/progressive_widen{TAG}.json", "w"), indent=1)
    print("mismatches", bad, "took", round(time.time() - t0), "s")


if __name__ == "__main__":
    main()
