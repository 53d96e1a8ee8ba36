"""What the activation loads cost the fragment kernel at 8 and 16 tokens (GPU, timing only).

Each lane loads its token's 128-column block of x for every weight block (2 KB per warp and
block per 8-token tile, against 1 KB of weights), so at 16 tokens a warp reads 4x as many
activation bytes as weight bytes, mostly from L2. This times every fragment tile (plus tiles with
more row groups per CTA, whose warps could share x through L1) as shipped and with the x loads
replaced by register moves of the pointer (wrong results), per shape best and step sums.
If "no x loads" is much faster at 16 tokens, more weight rows per B fragment would pay. Stop 30 adds
the same loads with L1 cache hints ("x evict_last", "x nc": bit-identical outputs) and four 32-row
tiles with 2-8 row groups per CTA sharing x.

    PYTHONPATH=. python benchmarks/mma_ablations/xloads.py --ms 8,16 --out benchmarks/results
"""
import re

import torch
from sweep import keep_best, ms_arg, report, shape_cases

import gearshift.kernels.int4_mma_gemv as mg
from gearshift.dispatch.profiler import time_us
from gearshift.dispatch.strategies import mma_configs
from gearshift.kernels.config import TileConfig

#: tiles with 4-8 row groups per CTA (warps sharing x through L1), not in the shipped list
EXTRA = [TileConfig(16, 0, 128, sk, w, 1, prefetch=pf, kwarps=kw) for sk, w, pf, kw in
         ((1, 8, False, 1), (1, 8, True, 1), (1, 16, False, 2), (1, 16, False, 4), (2, 8, False, 1),
          (1, 16, True, 2), (2, 16, False, 2))] + [
    # stop 30: 32-row tiles with 2-8 row groups per CTA
    TileConfig(32, 0, 128, 1, w, 1, kwarps=kw) for w, kw in ((8, 1), (8, 2), (16, 2), (16, 4))]


def no_xloads(asm: str) -> str:
    """The block's PTX with each 16-byte x load replaced by moves of its pointer's low word."""
    def repl(mt: re.Match) -> str:
        regs = [r.strip() for r in mt.group(1).split(",")]
        return "\n".join([f"cvt.u32.u64 {regs[0]}, {mt.group(2)};"] + [f"mov.b32 {r}, {regs[0]};" for r in regs[1:]])
    out = re.sub(r"ld\.global\.v4\.b32 \{([^}]*)\}, \[(\$\d+)\+\d+\];", repl, asm)
    assert "ld.global" not in out
    return out


def x_load_as(asm: str, op: str) -> str:
    """The block's PTX with its x loads issued as `op` (a cache-hinted form of ld.global.v4.b32)."""
    out = asm.replace("ld.global.v4.b32 ", op + " ")
    assert out.count(op) == asm.count("ld.global.v4.b32 ")
    return out


#: cache-hinted x loads (stop 30): keep the block's activations in L1 for the CTA's other warps
HINTED = {"x evict_last": "ld.global.L1::evict_last.v4.b32", "x nc": "ld.global.nc.L1::evict_last.v4.b32"}


def main() -> None:
    ms, out = ms_arg(__doc__, "8,16")
    shipped = dict(mg.MMA_ASM)
    variants = {"shipped": shipped, "no x loads": {k: no_xloads(v) for k, v in shipped.items()}}
    variants |= {label: {k: x_load_as(v, op) for k, v in shipped.items()} for label, op in HINTED.items()}
    rows, best = [], {}
    for shape, m, x, stores, ref in shape_cases(ms):
        for cfg in mma_configs(m) + EXTRA:
            if not mg.mma_gemv_supports(stores[0], cfg, m):
                continue
            mg.MMA_ASM.update(shipped)
            y = mg.mma_gemv(x, stores[0], cfg)
            rel = ((y.float() - ref).norm() / ref.norm()).item()
            assert rel < 3e-3, (shape, m, cfg.key(), rel)
            for label, asm in variants.items():
                mg.MMA_ASM.update(asm)
                if label in HINTED:  # the same loads with another cache policy: the same bits
                    assert torch.equal(mg.mma_gemv(x, stores[0], cfg), y), (shape, m, cfg.key(), label)
                us = time_us([lambda s=s: mg.mma_gemv(x, s, cfg) for s in stores])
                rows.append(dict(shape=shape, m=m, variant=label, config=cfg.to_dict(), us=us, rel_err=rel))
                keep_best(best, (shape, m, label), us, cfg)
        mg.MMA_ASM.update(shipped)
    report(out, "xloads", rows, best, ms, list(variants))


if __name__ == "__main__":
    main()
