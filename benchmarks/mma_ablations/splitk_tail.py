"""What the split-K reduction's tail costs the fragment kernel (GPU, timing only).

Every split-K program of `w4a16_mma` stores its partial, takes an arrival ticket (an acq_rel
atomic whose answer it must wait for) and, if last, sums the slices. This times each Llama-3-8B
shape over the fragment tile list with the tail as shipped (0), with the ticket but no sum (2)
and with neither (1: partials only, wrong results), per shape best and 32-layer step sums.
If 1 is much faster than 0, reducing in the consumer kernel instead would pay.

    PYTHONPATH=. python benchmarks/mma_ablations/splitk_tail.py --ms 1,8 --out benchmarks/results
"""
from sweep import keep_best, ms_arg, report, shape_cases

import gearshift.kernels.int4_mma_gemv as mg
from gearshift.dispatch.profiler import time_us
from gearshift.dispatch.strategies import mma_configs

TAILS = {0: "shipped", 2: "ticket only", 1: "no tail"}


def main() -> None:
    ms, out = ms_arg(__doc__, "1,8")
    rows, best = [], {}
    for shape, m, x, stores, ref in shape_cases(ms):
        for cfg in mma_configs(m):
            if cfg.kwarps > 1 or not mg.mma_gemv_supports(stores[0], cfg, m):
                continue  # the in-CTA tiles have no global tail
            rel = ((mg.mma_gemv(x, stores[0], cfg).float() - ref).norm() / ref.norm()).item()
            assert rel < 3e-3, (shape, m, cfg.key(), rel)
            for tail in TAILS:
                if tail and cfg.split_k == 1:
                    continue
                us = time_us([lambda s=s, t=tail: mg.mma_gemv(x, s, cfg, tail=t) for s in stores])
                rows.append(dict(shape=shape, m=m, tail=tail, config=cfg.to_dict(), us=us, rel_err=rel))
                for t in (TAILS if cfg.split_k == 1 else [tail]):  # unsplit tiles have no tail
                    keep_best(best, (shape, m, TAILS[t]), us, cfg)
    report(out, "splitk_tail", rows, best, ms, list(TAILS.values()))


if __name__ == "__main__":
    main()
