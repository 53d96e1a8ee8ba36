"""The fragment kernel with its inputs in fragment order and the per-block input sums from memory
(stop 34), per Llama-3-8B shape and token count, against the kernel as it is (GPU).

Why: after stop 33 the one-token loop still spends 136 SASS instructions per 128-column block and
is close to issue-bound. 16 of them are PRMTs that pair each input x_c with x_c+4 (the k order of
the nibble pairs a weight word yields), and half of its 16 MMAs only compute the block sums of the
inputs that scale-after needs (the min term and the +128 offset). A producer (RMSNorm, SwiGLU) can
write both for free: its stores in the fragments' column order (`to_fragment_order`) and the block
sums it has at hand. Variants:
`natural` (as shipped), `xperm` (inputs in fragment order, no PRMT: the same bits),
`xperm+xsum` (also the block sums from memory, no sum MMA: 111 instructions per block, and fewer
registers, so a 64-register cap is tried again).

Each of the seed map's best `--top` fragment tiles per shape and M is checked (xperm: bit-identical
to natural; xsum: against the torch reference) and timed over enough weight copies to exceed L2;
the inputs are permuted and summed before timing. Prints per M and variant the per-shape bests and
their 32-layer step sums.

    git checkout 009e1f9 && git apply benchmarks/results/fragment_order_block_sums.patch   # (not kept)
    PYTHONPATH=. python benchmarks/mma_ablations/xorder.py --ms 1,2,4,8,16 --out benchmarks/results

Measured (H100, `results/xorder_stop34_{a,b}_*.json`): per-shape best step sums 1.599 / 1.604 /
1.621 ms (natural / xperm / xperm+xsum) at one token, 1.649 / 1.618 / 1.640 at 4, 1.846 / 1.855 /
1.799 at 8, 2.316 / 2.273 / 2.314 at 16: within the runs' spread, although the loop lost 11-18% of
its instructions. So after stop 33 the loop's instruction count no longer bounds it; not kept.
"""
import dataclasses

import torch
from lop3 import seed_tiles
from sweep import keep_best, report, seeded_args, shape_cases

import gearshift.kernels.int4_mma_gemv as mg
from gearshift.dispatch.profiler import time_us

VARIANTS = {"natural": (False, False), "xperm": (True, False), "xperm+xsum": (True, True)}
CAPS = (0, 64)


def main() -> None:
    a, ms, seed, dims = seeded_args(__doc__, "1,2,4,8,16", 8)
    rows, best = [], {}
    for shape, m, x, stores, ref in shape_cases(ms):
        n, k = dims[shape]
        xp = mg.to_fragment_order(x).contiguous()
        sums = mg.block_sums_reference(x)
        assert torch.equal(mg.from_fragment_order(xp), x)
        for cfg0 in seed_tiles(seed, f"w4a16:g128:{n}x{k}", m, a.top):
            if not mg.mma_gemv_supports(stores[0], cfg0, m):
                continue
            y0 = mg.mma_gemv(x, stores[0], cfg0)
            for label, (perm, xsum) in VARIANTS.items():
                caps = (cfg0.maxnreg,) if not xsum else tuple(sorted({cfg0.maxnreg, *CAPS}))
                for cap in caps:
                    cfg = dataclasses.replace(cfg0, maxnreg=cap)
                    kw = dict(fragment_order=perm, block_sums=sums if xsum else None)
                    xin = xp if perm else x
                    y = mg.mma_gemv(xin, stores[0], cfg, **kw)
                    rel = ((y.float() - ref).norm() / ref.norm()).item()
                    assert rel < 3e-3, (shape, m, label, cfg.key(), rel)
                    if not xsum:
                        assert torch.equal(y, y0), (shape, m, label, cfg.key())
                    assert torch.equal(mg.mma_gemv(xin, stores[0], cfg, **kw), y), (shape, m, label, cfg.key())
                    us = time_us([lambda s=s: mg.mma_gemv(xin, s, cfg, **kw) for s in stores])
                    rows.append(dict(shape=shape, m=m, variant=label, config=cfg.to_dict(), us=us, rel_err=rel))
                    keep_best(best, (shape, m, label), us, cfg)
    report(a.out, f"xorder{a.tag}", rows, best, ms, list(VARIANTS))


if __name__ == "__main__":
    main()
