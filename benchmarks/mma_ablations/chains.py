"""The fragment kernel with its block's MMAs spread over 1, 2 or 4 accumulator chains (shorter
dependent HMMA chains, a few more registers): checked against the torch reference, then timed per
Llama-3-8B shape at M = 1, 8, 16 over a small tile sweep (GPU).
Usage: PYTHONPATH=. python benchmarks/mma_ablations/chains.py [--out DIR]
"""
import argparse
import itertools
import json
from pathlib import Path

import torch

import gearshift.kernels.int4_mma_gemv as mg
from gearshift.dispatch.profiler import copy_bandwidth, n_copies, random_store, time_us
from gearshift.kernels.config import TileConfig
from gearshift.kernels.reference import linear_reference

SHAPES = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--chains", default="1,2,4")
    ap.add_argument("--m", default="1,8,16")
    args = ap.parse_args()
    chains = [int(c) for c in args.chains.split(",")]
    ms = [int(m) for m in args.m.split(",")]
    base = dict(mg.MMA_ASM)
    variants = {c: {(dt, two, tiles): mg._mma_asm(dt, magic, two, tiles, c) for dt, magic in (("bf16", 0x4300), ("f16", 0x6400))
                    for two in (False, True) for tiles in (1, 2)} for c in chains}
    cfgs = [TileConfig(16, 0, 128, sk, w, 1) for sk, w in itertools.product((1, 2, 4, 8), (2, 4))]
    bw = copy_bandwidth()
    rows, best = [], {}
    for name, n, k in SHAPES:
        probe = random_store("int4", n, k, 128, "cuda")
        stores = [probe] + [random_store("int4", n, k, 128, "cuda") for _ in range(n_copies(probe) - 1)]
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = linear_reference(x.float(), stores[0], None)
            for c in chains:
                mg.MMA_ASM.update(variants[c])
                for cfg in cfgs:
                    if not mg.mma_gemv_supports(stores[0], cfg, m):
                        continue
                    y = mg.mma_gemv(x, stores[0], cfg)
                    rel = ((y.float() - ref).norm() / ref.norm()).item()
                    assert rel < 3e-3, (name, m, c, cfg.key(), rel)
                    us = time_us([lambda s=s: mg.mma_gemv(x, s, cfg) for s in stores])
                    rows.append(dict(shape=name, m=m, chains=c, config=cfg.to_dict(), us=us, rel_err=rel))
                    key = (name, m, c)
                    if key not in best or us < best[key][0]:
                        best[key] = (us, cfg.key())
            mg.MMA_ASM.update(base)
        del stores
        torch.cuda.empty_cache()
    dev = torch.cuda.get_device_name()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"mma_chains_{dev.replace(' ', '_')}.json").write_text(json.dumps(
        {"device": dev, "copy_bandwidth_Bps": bw, "rows": rows}, indent=1))
    print(f"{dev}; best us per shape, 32-layer step ms (floor {sum(n * k / 2 + n * k / 32 for _, n, k in SHAPES) * 32 / bw * 1e3:.3f})")
    for m in ms:
        for c in chains:
            tot = sum(best[(s, m, c)][0] for s, _, _ in SHAPES) * 32 / 1000
            print(f"M={m:2} chains={c}: " + "  ".join(f"{s} {best[(s, m, c)][0]:5.1f} {best[(s, m, c)][1]}"
                                                    for s, _, _ in SHAPES) + f"  step {tot:.3f}")


if __name__ == "__main__":
    main()
