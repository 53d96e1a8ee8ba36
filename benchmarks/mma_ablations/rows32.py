"""32 weight rows per warp (`TileConfig.bm = 32`: two A fragments per B fragment) against the
8 / 16-row tiles, per Llama-3-8B shape and token count (GPU).

At 16 tokens a warp of the 16-row kernel loads 4x as many activation bytes as weight bytes
(`xloads.py`: removing those loads takes the 16-token step from 3.05 to 2.10 ms); 32 rows per warp
halve that ratio. Each tile is checked against the torch reference and for bit-identical reruns,
then timed over enough weight copies to exceed L2 (blocks16 layout, as the engine runs it).

    PYTHONPATH=. python benchmarks/mma_ablations/rows32.py --ms 1,2,4,8,16 --out benchmarks/results
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
            fam = "32 rows" if cfg.bm == 32 else "8/16 rows"
            rows.append(dict(shape=shape, m=m, family=fam, config=cfg.to_dict(), us=us, rel_err=rel))
            keep_best(best, (shape, m, fam), us, cfg)
    report(out, "rows32", rows, best, ms, ["8/16 rows", "32 rows"])


if __name__ == "__main__":
    main()
