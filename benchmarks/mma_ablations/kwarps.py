"""The fragment kernel's K split inside the CTA (`TileConfig.kwarps`) against the global split-K
tiles, per Llama-3-8B shape and token count (GPU).

Each tile is checked against the torch reference and for bit-identical reruns, then timed over
enough weight copies to exceed L2 (blocks16 layout, as the engine runs it). Prints, per M, the
per-shape best of the global-split tiles, of the in-CTA tiles, and their 32-layer step sums.

    PYTHONPATH=. python benchmarks/mma_ablations/kwarps.py --ms 1,2,4,8,16 --out benchmarks/results
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="1,2,4,8,16", help="token counts (1..16)")
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
                y = mg.mma_gemv(x, stores[0], cfg)
                rel = ((y.float() - ref).norm() / ref.norm()).item()
                assert rel < 3e-3, (shape, m, cfg.key(), rel)
                assert torch.equal(mg.mma_gemv(x, stores[0], cfg), y), (shape, m, cfg.key())
                us = time_us([lambda s=s: mg.mma_gemv(x, s, cfg) for s in stores])
                fam = "in-CTA" if cfg.kwarps > 1 else "split-K"
                rows.append(dict(shape=shape, m=m, family=fam, config=cfg.to_dict(), us=us, rel_err=rel))
                if (shape, m, fam) not in best or us < best[(shape, m, fam)][0]:
                    best[(shape, m, fam)] = (us, cfg.key())
        del stores
        torch.cuda.empty_cache()
    dev = torch.cuda.get_device_name()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"kwarps_{dev.replace(' ', '_')}.json").write_text(json.dumps(
        {"device": dev, "rows": rows, "best": {f"{s}:{m}:{f}": v for (s, m, f), v in best.items()}}, indent=1))
    print(f"{dev}: best us per shape (tile); 32-layer step sum, ms")
    for m in ms:
        for fam in ("split-K", "in-CTA"):
            tot = sum(best[(s, m, fam)][0] for s, _, _ in SHAPES) * 32 / 1000
            print(f"M={m:2} {fam:>7}: " + "  ".join(f"{s} {best[(s, m, fam)][0]:5.1f} {best[(s, m, fam)][1]}"
                                                  for s, _, _ in SHAPES) + f"  step {tot:.3f}")


if __name__ == "__main__":
    main()
