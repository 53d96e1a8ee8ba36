"""The fragment kernel's K split inside the CTA (`TileConfig.kwarps`) against the global split-K
tiles, per Llama-3-8B shape and token count (GPU).

Each tile is checked against the torch reference and for bit-identical reruns, then timed over
enough weight copies to exceed L2 (blocks16 layout, as the engine runs it). Prints, per M, the
per-shape best of the global-split tiles, of the in-CTA tiles, and their 32-layer step sums.

    PYTHONPATH=. python benchmarks/mma_ablations/kwarps.py --ms 1,2,4,8,16 --out benchmarks/results
"""
import torch
from sweep import keep_best, ms_arg, report, shape_cases

import gearshift.kernels.int4_mma_gemv as mg
from gearshift.dispatch.profiler import time_us
from gearshift.dispatch.strategies import mma_configs


def main() -> None:
    ms, out = ms_arg(__doc__, "1,2,4,8,16")
    rows, best = [], {}
    for shape, m, x, stores, ref in shape_cases(ms):
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
            keep_best(best, (shape, m, fam), us, cfg)
    report(out, "kwarps", rows, best, ms, ["split-K", "in-CTA"])


if __name__ == "__main__":
    main()
