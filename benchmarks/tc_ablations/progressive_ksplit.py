"""`w4a8_progressive` tiles whose two consumer warpgroups split the K tiles (`TileConfig.kwarps` = 2) against the
map's picks, per Llama-3-8B shape and M, and a what-if map with the faster of the two, for `policy_ab.py --b`.

Why (stop 73): at 64 tokens the map's one-consumer tiles keep one warp per scheduler, which issues on about a third
of the cycles (ncu), and a split-K over programs pays for its workspace and counters (the skeleton of qkv's 64 x 64
tile took 4.7 us alone, 6.5 split in two). Every K-split tile is checked bit for bit against the kernel's torch
model before it is timed.

    PYTHONPATH=. python benchmarks/tc_ablations/progressive_ksplit.py --map gearshift/data/policy/NVIDIA_H200.json \\
        --ms 64,128 --map-out $OUT/ksplit_map.json
    python benchmarks/policy_ab.py --a gearshift/data/policy/NVIDIA_H200.json --b $OUT/ksplit_map.json \\
        --mode w4a8 --int4-prog --norm-codes --m 64,96,128

Writes $OUT/<tag>.json and prints a table last. The map is loaded as the engine loads it (run this on the GPU
the A/B runs on); the what-if map keeps no timings.
"""
import argparse
import json
import os

import torch

from gearshift.dispatch.policy import Choice, load_map_file, type_key
from gearshift.dispatch.profiler import PRESETS, n_copies, random_store, time_us
from gearshift.kernels.act_quant import quantize_act_triton
from gearshift.kernels.w4a8_progressive import (progressive_codes, progressive_configs, progressive_supports,
                                                w4a8_progressive_emulate)
from gearshift.quant.activations import ActQuantSpec

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--map", required=True, help="the policy map whose W4A8 picks are the baseline")
ap.add_argument("--ms", default="64,128", help="map buckets to time (comma-separated)")
ap.add_argument("--map-out", default="", help="write the what-if map here")
ap.add_argument("--tag", default="progressive_ksplit")
args = ap.parse_args()
dev, act = "cuda", ActQuantSpec("int8")
pm = load_map_file(args.map)
rows = []
for m in [int(v) for v in args.ms.split(",")]:
    i = pm.buckets.index(m)
    for name, n, k in PRESETS["llama3-8b"]["shapes"]:
        key = type_key("w4a8", 128, n, k)
        pick = pm.entries[key][i]
        st0 = random_store("int4p", n, k, 128, dev, layout="blocks16")
        copies = [st0] + [random_store("int4p", n, k, 128, dev, layout="blocks16") for _ in range(n_copies(st0) - 1)]
        codes, scales = quantize_act_triton(torch.randn(m, k, device=dev, dtype=torch.bfloat16), act)
        row = {"m": m, "shape": name, "pick": f"{pick.strategy}@{pick.config.key()}", "tiles": {}}
        if pick.strategy == "w4a8_progressive":
            row["pick_us"] = time_us([lambda s=s: progressive_codes(codes, scales, s, pick.config, torch.bfloat16)
                                      for s in copies])
        for cfg in progressive_configs(m):
            if cfg.kwarps != 2 or not progressive_supports(st0, act, cfg):
                continue
            emu = w4a8_progressive_emulate(codes, scales, st0, torch.float32, cfg.split_k, cfg)
            got = progressive_codes(codes, scales, st0, cfg, torch.float32)
            if not torch.equal(got, emu):
                raise SystemExit(f"{name} M={m} {cfg.key()}: not the model's bits")
            row["tiles"][cfg.key()] = time_us([lambda s=s, c=cfg: progressive_codes(codes, scales, s, c,
                                                                                     torch.bfloat16) for s in copies])
        best = min(row["tiles"], key=row["tiles"].get)
        row["best"], row["best_us"] = best, row["tiles"][best]
        if args.map_out and row["best_us"] < row.get("pick_us", float("inf")):
            cfg = next(c for c in progressive_configs(m) if c.key() == best)
            pm.entries[key][i] = Choice("w4a8_progressive", cfg, row["best_us"])
            row["taken"] = True
        print(row, flush=True)
        rows.append(row)
        del copies, st0
        torch.cuda.empty_cache()
json.dump({"device": torch.cuda.get_device_name(), "map": args.map, "rows": rows},
          open(os.path.join(os.environ.get("OUT", "."), f"{args.tag}.json"), "w"), indent=1)
if args.map_out:
    pm.timings = {}
    pm.save(args.map_out)
print(f"\n{'M':>5} {'shape':8} {'map pick':44} {'us':>7}  {'best K split':28} {'us':>7}  ratio")
for r in rows:
    p = r.get("pick_us", float("nan"))
    print(f"{r['m']:5d} {r['shape']:8} {r['pick'][:44]:44} {p:7.1f}  {r['best']:28} {r['best_us']:7.1f}  "
          f"{r['best_us'] / p:.3f}")
