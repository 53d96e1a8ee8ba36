"""Fewer instructions per weight in the fragment kernel (stop 33), per Llama-3-8B shape and token
count, against the kernel as it was (GPU).

Why: Nsight Compute puts the one-token gate_up tile at 14 cycles per issued instruction with half
the scheduler slots busy, while a plain streaming kernel with the same grid and occupancy reads the
same bytes 25% faster (`results/ncu/ncu_frag.txt`, `ncu_skel64.txt`): the fragment kernel is close
to issue-bound. Its loop spent 182 SASS instructions per 128-column block, 64 of them LOP3s: each
nibble pair's `and` + `or` were two LOP3s because SASS LOP3 takes one immediate. Variants:
`and+or` (as before), `lop3` (one LOP3 per pair, the magic in a register: 149 per block),
`lop3+paired` (also two blocks per loop trip, `TileConfig.pairs`: no register copies at the loop's
end, 136 per block).
The fewer instructions come with other register counts, so every tile also runs under register
caps of 64 and 80 (`TileConfig.maxnreg`: 4 / 3 CTAs of 8 warps per SM).

Each of the seed map's best `--top` fragment tiles per shape and M (all tiles with `--top 0`) is
checked against the torch reference and for bit-identical reruns, then timed over enough weight
copies to exceed L2. Prints per M and variant the per-shape bests and their 32-layer step sums.

    PYTHONPATH=. python benchmarks/mma_ablations/lop3.py --ms 1,16 --out benchmarks/results
"""
import dataclasses

import torch
from sweep import keep_best, report, seeded_args, shape_cases

import gearshift.kernels.int4_mma_gemv as mg
from gearshift.dispatch.policy import parse_candidate
from gearshift.dispatch.profiler import time_us
from gearshift.dispatch.strategies import mma_configs
from gearshift.kernels.config import TileConfig

VARIANTS = {"and+or": (False, False), "lop3": (True, False), "lop3+paired": (True, True)}
CAPS = (0, 64, 80)


def seed_tiles(seed: dict, shape_key: str, m: int, top: int) -> list[TileConfig]:
    """The seed map's `top` fastest w4a16_mma tiles at (shape, m), or every fragment tile."""
    if not top:
        return mma_configs(m)
    timed = seed["timings"].get(shape_key, {}).get(str(m), {})
    best = sorted((us, k) for k, us in timed.items() if k.startswith("w4a16_mma@"))[:top]
    return [parse_candidate(k)[1] for _, k in best]


def main() -> None:
    a, ms, seed, dims = seeded_args(__doc__, "1,16", 8)  # --top 0: every fragment tile
    rows, best = [], {}
    for shape, m, x, stores, ref in shape_cases(ms):
        n, k = dims[shape]
        for cfg0 in seed_tiles(seed, f"w4a16:g128:{n}x{k}", m, a.top):
            for label, (fused, paired) in VARIANTS.items():
                mg.FUSED_LOP3 = fused
                for cap in (CAPS if fused else (0,)):
                    cfg = dataclasses.replace(cfg0, maxnreg=cap, pairs=paired)
                    if not mg.mma_gemv_supports(stores[0], cfg, m):
                        continue
                    y = mg.mma_gemv(x, stores[0], cfg)
                    rel = ((y.float() - ref).norm() / ref.norm()).item()
                    assert rel < 3e-3, (shape, m, label, cfg.key(), rel)
                    assert torch.equal(mg.mma_gemv(x, stores[0], cfg), y), (shape, m, label, cfg.key())
                    us = time_us([lambda s=s: mg.mma_gemv(x, s, cfg) for s in stores])
                    rows.append(dict(shape=shape, m=m, variant=label, config=cfg.to_dict(), us=us, rel_err=rel))
                    keep_best(best, (shape, m, label), us, cfg)
        mg.FUSED_LOP3 = True
    report(a.out, f"lop3{a.tag}", rows, best, ms, list(VARIANTS))


if __name__ == "__main__":
    main()
