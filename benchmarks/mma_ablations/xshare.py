"""The fragment kernel with each block's activations staged in shared memory (GPU; stop 41).

At 9..16 tokens every warp of `int4_mma_gemv` loads its own copy of the program's activations for
each 128-column block (64 bytes per lane and token tile): with 32 weight rows per warp that is twice
the warp's weight bytes, from L2. Stop 30 measured the step at 16 tokens 22% faster with those loads
replaced by register moves (wrong results, `xloads.py`), and W4A8, whose int8 codes halve them, runs
16 tokens 20% faster than W4A16. `TileConfig.xshare` makes the RG row groups of a CTA that run the same
K slice load each block's inputs once, into a double-buffered shared-memory buffer (one named barrier
per block), and read their B fragments there: RG times fewer activation bytes from L2.

Per Llama-3-8B shape and M: the shipped map's pick, and each xshare tile with its twin without
xshare (the same arithmetic: the bits must be equal), over enough weight copies to miss L2
(`profiler.n_copies`). The step sums at the end compare the map with the map plus the xshare tiles.

Stop 41 (H100, `results/xshare_stop41_*.json`, summary `results/xshare_stop41.md`): bit-identical everywhere;
per-shape 0.92-0.96x the map's pick on qkv / o at 16 tokens and o / gate_up / down at 8, no gain on gate_up
and down at 16. The map took xshare tiles on 5 of 8 points (whole W4A16 step 0.965-0.978 at 5-16 tokens).

    PYTHONPATH=. python benchmarks/mma_ablations/xshare.py --m 16,8 --out $OUT
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton

from gearshift.dispatch.dispatcher import AdaptiveDispatcher
from gearshift.dispatch.profiler import PRESETS, n_copies, random_store, time_us
from gearshift.kernels import int4_mma_gemv as mg
from gearshift.kernels.config import TileConfig

SHAPES = {name: (n, k) for name, n, k in PRESETS["llama3-8b"]["shapes"]}
LAYERS = 32

#: (rows per warp, split-K, warps, warps per row group, register cap, loop: "" one block per trip, "T" two
#: (`pairs`), "L" the warp's whole K slice loaded before the PDL wait (`preload`)) of the xshare tiles
TILES = ((32, 1, 4, 2, 0, ""), (32, 1, 4, 2, 128, ""), (32, 1, 8, 4, 0, ""), (32, 1, 8, 4, 128, ""),
         (32, 1, 8, 2, 0, ""), (32, 1, 8, 2, 128, ""), (32, 1, 4, 1, 0, ""), (32, 1, 2, 1, 0, ""),
         (32, 1, 16, 4, 128, ""), (32, 1, 16, 8, 128, ""), (16, 1, 8, 4, 0, ""), (16, 1, 8, 2, 0, ""),
         (16, 1, 16, 4, 0, ""), (16, 1, 4, 2, 0, ""), (16, 1, 16, 8, 0, ""), (32, 2, 8, 4, 128, ""),
         (32, 2, 4, 2, 128, ""),
         (32, 1, 4, 2, 0, "T"), (32, 1, 8, 4, 0, "T"), (32, 1, 8, 4, 128, "T"), (32, 1, 8, 2, 0, "T"),
         (16, 1, 8, 4, 0, "T"), (16, 1, 16, 4, 0, "T"), (16, 1, 4, 2, 0, "T"), (16, 1, 16, 8, 0, "T"),
         (32, 1, 16, 8, 128, "T"), (16, 1, 8, 2, 0, "T"),
         (16, 1, 8, 4, 0, "L"), (16, 1, 16, 4, 0, "L"), (16, 1, 4, 2, 0, "L"), (16, 1, 16, 8, 0, "L"),
         (32, 1, 8, 4, 0, "L"), (32, 1, 16, 8, 128, "L"), (16, 1, 8, 2, 0, "L"),
         # the 2-warp CTAs of gate_up's pick (m32 w2 kw2 r128) as two row groups
         (32, 1, 2, 1, 128, ""), (32, 1, 2, 1, 128, "T"), (32, 1, 2, 1, 0, "T"), (16, 1, 2, 1, 128, ""),
         (16, 1, 2, 1, 0, "T"))


def tile(bm, sk, w, kw, reg, loop, xshare=True):
    return TileConfig(bm, 0, 128, sk, w, 1, kwarps=kw, maxnreg=reg, pairs=loop == "T", preload=loop == "L",
                      xshare=xshare)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", default="16,8")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--twins", type=int, default=1, help="also time each tile without xshare")
    ap.add_argument("--only", default="", help="time only these tiles: comma-separated indexes into TILES")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    disp = AdaptiveDispatcher()
    rows, dev, t0 = [], torch.cuda.get_device_name(), time.time()
    ms = [int(v) for v in a.m.split(",")]
    for name in a.shapes.split(","):
        n, k = SHAPES[name]
        stores = [random_store("int4", n, k, 128, "cuda", layout="blocks16")]
        stores += [random_store("int4", n, k, 128, "cuda", layout="blocks16") for _ in range(n_copies(stores[0]) - 1)]
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            c = disp.choose(stores[0], None, m)
            r = {"shape": name, "m": m, "map_choice": None if c is None else f"{c.strategy} {c.config.key()}",
                 "map_us": time_us([lambda s=s: disp.linear(x, s, None) for s in stores]), "tiles": {}}
            for spec in [TILES[int(i)] for i in a.only.split(",")] if a.only else TILES:
                cfg = tile(*spec)
                if not mg.mma_gemv_supports(stores[0], cfg, m):
                    continue
                twin = tile(*spec, xshare=False)
                e = {}
                try:
                    y = mg.mma_gemv(x, stores[0], cfg)
                    y2 = mg.mma_gemv(x, stores[0], twin)
                    torch.cuda.synchronize()
                    e["same_bits"] = bool(torch.equal(y, y2))
                    e["rel_err"] = ((y.float() - y2.float()).norm() / y2.float().norm()).item()
                    if e["rel_err"] < 1e-2:
                        e["us"] = time_us([lambda s=s: mg.mma_gemv(x, s, cfg) for s in stores])
                        if a.twins:
                            e["twin_us"] = time_us([lambda s=s: mg.mma_gemv(x, s, twin) for s in stores])
                except Exception as ex:  # noqa: BLE001 - report, keep going
                    e["error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
                r["tiles"][cfg.key()] = e
            rows.append(r)
            ok = {kk: v["us"] for kk, v in r["tiles"].items() if "us" in v}
            best = min(ok, key=ok.get) if ok else None
            r["best_xshare"] = best
            print(f"[{time.time() - t0:5.0f}s] {name:8s} M={m:3d} map {r['map_us']:7.2f} ({r['map_choice']}) "
                  f"best xshare {ok.get(best, float('nan')):7.2f} {best}", flush=True)
            for kk, v in r["tiles"].items():
                print(f"      {kk:28s} {v.get('us', float('nan')):7.2f} twin {v.get('twin_us', float('nan')):7.2f} "
                      f"same bits {v.get('same_bits')} {v.get('error', '')}", flush=True)
    steps = []
    for m in ms:
        at = [r for r in rows if r["m"] == m]
        if len(at) != len(SHAPES):
            continue
        steps.append({"m": m, "map_ms": LAYERS * sum(r["map_us"] for r in at) / 1000,
                      "map_or_xshare_ms": LAYERS * sum(min([r["map_us"]] + [v["us"] for v in r["tiles"].values()
                                                                             if "us" in v]) for r in at) / 1000})
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"xshare{a.tag}_{dev.replace(' ', '_')}.json")
    json.dump({"device": dev, "torch": torch.__version__, "triton": triton.__version__, "rows": rows,
               "steps": steps}, open(path, "w"), indent=1)
    print(f"wrote {path}")
    for s in steps:
        print(f"M={s['m']:3d}: map {s['map_ms']:.3f} ms per 32-layer step (per-shape sums), with xshare tiles "
              f"{s['map_or_xshare_ms']:.3f} ({s['map_or_xshare_ms'] / s['map_ms']:.3f})")


if __name__ == "__main__":
    main()
