"""What the split-K reduction's tail costs the fragment kernel (GPU, timing only).

Every split-K program of `w4a16_mma` stores its partial, takes an arrival ticket (an acq_rel
atomic whose answer it must wait for) and, if last, sums the slices. This times each Llama-3-8B
shape over the fragment tile list with the tail as shipped (0), with the ticket but no sum (2)
and with neither (1: partials only, wrong results), per shape best and 32-layer step sums.
If 1 is much faster than 0, reducing in the consumer kernel instead would pay.

    PYTHONPATH=. python benchmarks/mma_ablations/splitk_tail.py --ms 1,8 --out benchmarks/results
"""
import argparse
import json
from pathlib import Path

import torch

import gearshift.kernels.int4_mma_gemv as mg
from gearshift.dispatch.profiler import n_copies, random_store, time_us
from gearshift.dispatch.strategies import mma_configs
from gearshift.kernels.reference import linear_reference

SHAPES = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))
TAILS = {0: "shipped", 2: "ticket only", 1: "no tail"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="1,8", help="token counts (1..16)")
    ap.add_argument("--out", default="benchmarks/results", help="folder for the JSON")
    args = ap.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    rows, best = [], {}
    for shape, n, k in SHAPES:
        stores = [random_store("int4", n, k, 128, "cuda", layout="blocks16")]
        stores += [random_store("int4", n, k, 128, "cuda", layout="blocks16") for _ in range(n_copies(stores[0]) - 1)]
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = linear_reference(x.float(), stores[0], None)
            for cfg in mma_configs(m):
                if not mg.mma_gemv_supports(stores[0], cfg, m):
                    continue
                rel = ((mg.mma_gemv(x, stores[0], cfg).float() - ref).norm() / ref.norm()).item()
                assert rel < 3e-3, (shape, m, cfg.key(), rel)
                for tail in TAILS:
                    if tail and cfg.split_k == 1:
                        continue
                    us = time_us([lambda s=s, t=tail: mg.mma_gemv(x, s, cfg, tail=t) for s in stores])
                    rows.append(dict(shape=shape, m=m, tail=tail, config=cfg.to_dict(), us=us, rel_err=rel))
                    for t in ([0, 1, 2] if cfg.split_k == 1 else [tail]):  # unsplit tiles have no tail
                        if (shape, m, t) not in best or us < best[(shape, m, t)][0]:
                            best[(shape, m, t)] = (us, cfg.key())
        del stores
        torch.cuda.empty_cache()
    dev = torch.cuda.get_device_name()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / f"splitk_tail_{dev.replace(' ', '_')}.json"
    path.write_text(json.dumps({"device": dev, "rows": rows,
                                "best": {f"{s}:{m}:{t}": v for (s, m, t), v in best.items()}}, indent=1))
    print(f"{dev}: best us per shape (tile); 32-layer step sum, ms")
    for m in ms:
        for t, label in TAILS.items():
            tot = sum(best[(s, m, t)][0] for s, _, _ in SHAPES) * 32 / 1000
            print(f"M={m:2} {label:>11}: " + "  ".join(f"{s} {best[(s, m, t)][0]:5.1f} {best[(s, m, t)][1]}"
                                                      for s, _, _ in SHAPES) + f"  step {tot:.3f}")


if __name__ == "__main__":
    main()
