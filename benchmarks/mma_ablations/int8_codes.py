"""W4A8 / W4A4 at 1..16 tokens: the fragment kernel on int8 activation codes with the int8 MMA
(`w4a8_mma_int8`, stop 34) against the same codes as exact bf16 through the bf16 MMA (`w4a8_mma`),
per Llama-3-8B shape and token count (GPU).

Why: with bf16 codes a W4A8 linear costs what W4A16 costs (same MMAs, same activation bytes) plus
its quantizer. The int8 MMA m16n8k32 takes a nibble as an int8 in place (three instructions per
word of 8 weights instead of seven), does half the MMAs, and reads half the activation bytes,
which at 9..16 tokens are 2-4x the weight bytes a warp reads (mostly L1 / L2 traffic).

Each of the seed map's best `--top` w4a8_mma tiles per shape and M runs both ways (int8 also under
a 64-register cap): checked against the torch reference on the dequantized codes, and the int8
result against the bf16 one; then timed over enough weight copies to exceed L2 (the codes made
before timing, as an RMSNorm emits them). Prints per M and variant the per-shape bests and their
32-layer step sums.

    PYTHONPATH=. python benchmarks/mma_ablations/int8_codes.py --ms 1,2,4,8,16 --out benchmarks/results
"""
import dataclasses

import torch
from sweep import keep_best, report, seeded_args, shape_cases

import gearshift.kernels.int4_mma_gemv as mg
from gearshift.dispatch.policy import parse_candidate
from gearshift.dispatch.profiler import time_us
from gearshift.kernels.reference import linear_reference

VARIANTS = ("bf16 codes", "int8 codes")


def main() -> None:
    a, ms, seed, dims = seeded_args(__doc__, "1,2,4,8,16", 6)
    rows, best = [], {}
    for shape, m, x, stores, _ in shape_cases(ms):
        n, k = dims[shape]
        codes = torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8)
        scales = torch.rand(m, device="cuda") / 100
        ref = linear_reference(codes.float() * scales[:, None], stores[0], None)
        timed = seed["timings"].get(f"w4a8:g128:{n}x{k}", {}).get(str(m), {})
        tiles = [parse_candidate(c)[1] for _, c in sorted((us, c) for c, us in timed.items()
                                                           if us is not None and c.startswith("w4a8_mma@"))[:a.top]]
        for cfg0 in tiles:
            y16 = None
            for label, x_in in zip(VARIANTS, (codes.to(torch.bfloat16), codes)):
                for cap in ((cfg0.maxnreg,) if label == "bf16 codes" else sorted({cfg0.maxnreg, 0, 64})):
                    cfg = dataclasses.replace(cfg0, maxnreg=cap)
                    if not mg.mma_gemv_supports(stores[0], cfg, m, x_in.dtype):
                        continue

                    def run(s, cfg=cfg, x_in=x_in):
                        return mg.mma_gemv(x_in, s, cfg, token_scales=scales, out_dtype=torch.bfloat16)

                    y = run(stores[0])
                    rel = ((y.float() - ref).norm() / ref.norm()).item()
                    assert rel < 3e-3, (shape, m, label, cfg.key(), rel)
                    if y16 is None:
                        y16 = y
                    assert ((y.float() - y16.float()).norm() / y16.float().norm()).item() < 3e-3
                    us = time_us([lambda s=s: run(s) for s in stores])
                    rows.append(dict(shape=shape, m=m, variant=label, config=cfg.to_dict(), us=us, rel_err=rel))
                    keep_best(best, (shape, m, label), us, cfg)
    report(a.out, f"int8_codes{a.tag}", rows, best, ms, list(VARIANTS))


if __name__ == "__main__":
    main()
