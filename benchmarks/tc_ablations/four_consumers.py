"""W4A16 at large M with four register-A consumers instead of two (GPU; stop 41).

`w4a16_wgmma`'s register-A consumers retire each wgmma before their next dequant (ptxas serializes a
pipelined register-A wgmma; stops 26 and 40), so what keeps the tensor cores busy is the other
consumer's wgmma. With two consumers (64 weight rows x 256 tokens each, m64n256) the tile runs at
1.14x the time of its own wgmmas fed from shared memory (stop 40). Here a 256 x 128 tile has four
consumers, the two row halves x the two token halves (m64n128 each, `TileConfig(warps=16)`): each
row half is dequantized twice, but four independent wgmma streams queue on the tensor cores.
The launch is 17 warps (five warpgroups, 96 registers each at launch; the consumers then take 112
with setmaxnreg).

Per Llama-3-8B shape and M: cuBLAS bf16 on a dense copy, the shipped map's W4A16 choice, the
shipped two-consumer tiles and the four-consumer tiles, each checked against the two-consumer tile's
output (the same arithmetic per output element, so the same bits are expected), summed per 32-layer
step at the end.

Stop 41 (H100, `results/four_consumers_stop41_run1_*.json`): bit-identical, and 1.04x-1.37x the time
of the best two-consumer tile at every shape and M, 1.25x-1.37x from 1024 tokens on (gate_up 4096:
1736 us against 1469 for the same BK = 64 tile with two consumers). Dequantizing each row half twice
costs more than four wgmma streams gain: the register-A consumers' dequantization is not hidden
behind the other consumers' wgmmas. Not kept: the kernel change is `results/four_consumers.patch`
(apply it to run this script).

    git apply benchmarks/results/four_consumers.patch
    PYTHONPATH=. python benchmarks/tc_ablations/four_consumers.py --m 256,512,1024,2048,4096 --out $OUT
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton

import gearshift.kernels.w4a16_wgmma as W
from gearshift.dispatch.dispatcher import AdaptiveDispatcher
from gearshift.dispatch.profiler import PRESETS, random_store, time_us
from gearshift.kernels.config import TileConfig

SHAPES = {name: (n, k) for name, n, k in PRESETS["llama3-8b"]["shapes"]}
LAYERS = 32

#: name -> (BM, BN, BK, split-K, warps, stages); warps = 16 is the four-consumer launch
TILES = {"two_k64_s4": (256, 128, 64, 1, 8, 4), "two_k128_s3": (256, 128, 128, 1, 8, 3),
         "four_k64_s3": (256, 128, 64, 1, 16, 3), "four_k64_s4": (256, 128, 64, 1, 16, 4),
         "four_k64_s5": (256, 128, 64, 1, 16, 5), "four_k64_s6": (256, 128, 64, 1, 16, 6),
         "four_bm128_k64_s6": (128, 128, 64, 1, 16, 6), "four_k64_s4_sk2": (256, 128, 64, 2, 16, 4),
         "four_k128_s2": (256, 128, 128, 1, 16, 2)}
REFERENCE = "two_k64_s4"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", default="256,512,1024,2048,4096")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tiles", default=",".join(TILES))
    ap.add_argument("--fmt", default="int4", choices=("int4", "int4p"))
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    disp = AdaptiveDispatcher()
    tiles = {name: TileConfig(*TILES[name][:6]) for name in a.tiles.split(",")}
    ms = [int(v) for v in a.m.split(",")]
    rows, dev, t0 = [], torch.cuda.get_device_name(), time.time()
    for name in a.shapes.split(","):
        n, k = SHAPES[name]
        store = random_store(a.fmt, n, k, 128, "cuda", layout="blocks16")
        wd = store.dequantize(torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            r = {"shape": name, "m": m, "bf16_us": time_us([lambda: x @ wd.t()]),
                 "map_us": time_us([lambda: disp.linear(x, store, None)])}
            c = disp.choose(store, None, m)
            r["map_choice"] = None if c is None else f"{c.strategy} {c.config.key() if c.config else ''}"
            ref = W.w4a16_wgmma(x, store, TileConfig(*TILES[REFERENCE]))
            for tn, cfg in tiles.items():
                if not W.wgmma_supports(store, cfg, x.dtype):
                    r[tn] = "unsupported"
                    continue
                try:
                    y = W.w4a16_wgmma(x, store, cfg)
                    torch.cuda.synchronize()
                    r[f"{tn}_same_bits"] = bool(torch.equal(y, ref))
                    err = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
                    if not err < 5e-3:
                        r[tn] = f"wrong: {err:.3g}"
                        continue
                    r[tn] = time_us([lambda: W.w4a16_wgmma(x, store, cfg)])
                except Exception as ex:  # noqa: BLE001 - report, keep going
                    r[tn] = f"error: {type(ex).__name__}: {str(ex)[:300]}"
            rows.append(r)
            timed = {tn: r[tn] for tn in tiles if isinstance(r.get(tn), float)}
            print(f"[{time.time() - t0:5.0f}s] {name:8s} M={m:5d} cuBLAS {r['bf16_us']:8.1f} map {r['map_us']:8.1f} "
                  + " ".join(f"{tn} {v:.1f}{'' if r.get(tn + '_same_bits', True) else '*'}" for tn, v in timed.items())
                  + " " + " ".join(f"{tn}: {r[tn]}" for tn in tiles if isinstance(r.get(tn), str)), flush=True)
    steps = []
    for m in ms:
        at = [r for r in rows if r["m"] == m]
        if len(at) != len(SHAPES):
            continue

        def best(prefix):
            vals = [min((r[t] for t in tiles if t.startswith(prefix) and isinstance(r.get(t), float)), default=None)
                    for r in at]
            return None if None in vals else LAYERS * sum(vals) / 1000

        s = {"m": m, "cublas_ms": LAYERS * sum(r["bf16_us"] for r in at) / 1000,
             "map_ms": LAYERS * sum(r["map_us"] for r in at) / 1000, "best_two_ms": best("two"),
             "best_four_ms": best("four")}
        s["map_or_four_ms"] = LAYERS * sum(min([r["map_us"]] + [r[t] for t in tiles if t.startswith("four")
                                                                 and isinstance(r.get(t), float)]) for r in at) / 1000
        steps.append(s)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"four_consumers{a.tag}_{dev.replace(' ', '_')}.json")
    json.dump({"device": dev, "torch": torch.__version__, "triton": triton.__version__, "fmt": a.fmt,
               "four_regs": int(W.FOUR_REGS), "tiles": TILES, "rows": rows, "steps": steps}, open(path, "w"), indent=1)
    print(f"wrote {path}")
    print("M      cuBLAS    map   two    four   min(map,four)   (ms per 32-layer step)")
    for s in steps:
        print(f"{s['m']:5d} {s['cublas_ms']:8.3f} {s['map_ms']:7.3f} {s['best_two_ms'] or float('nan'):7.3f} "
              f"{s['best_four_ms'] or float('nan'):7.3f} {s['map_or_four_ms']:7.3f}  "
              f"x cuBLAS: map {s['map_ms'] / s['cublas_ms']:.3f} min {s['map_or_four_ms'] / s['cublas_ms']:.3f}")


if __name__ == "__main__":
    main()
