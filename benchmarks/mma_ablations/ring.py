"""The fragment kernel with its weights streamed through a bulk-copy ring in shared memory
(`TileConfig.stages` > 1, stop 33) against the register-prefetch tiles, per Llama-3-8B shape and
token count (GPU).

Why: at 1..8 tokens the fragment kernel is bound by the bytes each warp keeps in flight (stop 31:
no faster on the H200's faster memory), and every block in flight costs registers, so occupancy.
In the ring each warp's lane 0 asks the TMA unit for `stages` blocks ahead (1 KB each at 16 rows),
and the lanes read them from shared memory when they arrive: `stages` KB per warp in flight
without holding registers, the first of them before the PDL wait.

Each tile is checked against the torch reference and for bit-identical reruns, then timed over
enough weight copies to exceed L2 (blocks16). Families: `registers` = the register-prefetch tiles
the map chooses from (in-CTA K split, 2-block steps, preloads), `ringS` = the bulk ring of depth S
on the in-CTA base tiles. Prints per M the per-shape bests and their 32-layer step sums.

    git apply benchmarks/results/mma_bulk_ring_x_prefetch.patch   # the ring left the kernel in stop 34
    PYTHONPATH=. python benchmarks/mma_ablations/ring.py --ms 1,4,8 --out benchmarks/results

Measured (stop 33, `results/ring_stop33_*`): never faster on the best tiles, and the deeper the
ring the slower; see docs/kernels_history.md, "Stop 33".
"""
import dataclasses

from sweep import family_sweep, ms_arg

from gearshift.dispatch.strategies import K_WARP_TILES, PRELOAD_TILES
from gearshift.kernels.config import TileConfig

#: (rows per warp, split, warps, warps per row group): the ring's base tiles
BASES = ((16, 1, 8, 4), (16, 1, 8, 8), (16, 1, 4, 4), (16, 1, 2, 2), (16, 1, 16, 8), (16, 1, 16, 16), (8, 1, 8, 8),
         (8, 1, 4, 4), (8, 1, 16, 16), (32, 1, 4, 4), (32, 1, 8, 4), (32, 1, 2, 2), (16, 2, 8, 8))
STAGES = (2, 3, 4, 6)


def configs(m: int) -> list[TileConfig]:
    regs = [TileConfig(r, 0, 128, sk, w, 1, prefetch=pf, kwarps=kw) for r, sk, w, pf, kw in K_WARP_TILES]
    regs += [TileConfig(r, 0, 128, sk, w, 1, kwarps=kw, preload=True) for r, sk, w, kw in PRELOAD_TILES]
    if m > 8:
        regs = [dataclasses.replace(c, prefetch=True) if c.bm == 32 else c for c in regs]
    ring = [TileConfig(r, 0, 128, sk, w, st, kwarps=kw) for r, sk, w, kw in BASES for st in STAGES]
    return regs + ring


def main() -> None:
    ms, out = ms_arg(__doc__, "1,4,8")
    fams = ["registers"] + [f"ring{s}" for s in STAGES]
    family_sweep(ms, lambda cfg: f"ring{cfg.stages}" if cfg.stages > 1 else "registers", fams, out, "ring",
                 configs=configs)


if __name__ == "__main__":
    main()
