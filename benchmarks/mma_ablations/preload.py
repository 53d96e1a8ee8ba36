"""TileConfig.preload: the fragment kernel issues all of a warp's weight loads before its PDL wait,
so that under an early trigger a launch's weight stream overlaps its predecessor, against the
stepped loop (one step in flight). GPU.

Per Llama-3-8B shape and token count, the in-CTA K-split tiles (the map's family at 1..8 tokens)
are checked against the torch reference and for bit-identical reruns, then timed over enough
weight copies to exceed L2, stepped and preloaded; prints the per-shape bests of both families
and their 32-layer step sums. Whole steps are judged with a re-profiled map (`gearshift profile`,
whose candidates include `strategies.PRELOAD_TILES`) and `benchmarks/policy_ab.py`.

    PYTHONPATH=. python benchmarks/mma_ablations/preload.py --ms 1,4,8 --out benchmarks/results
"""
import dataclasses

from sweep import family_sweep, ms_arg

from gearshift.dispatch.strategies import PRELOAD_TILES
from gearshift.kernels.config import TileConfig


def configs(m: int) -> list[TileConfig]:
    pre = [TileConfig(r, 0, 128, sk, w, 1, kwarps=kw, preload=True) for r, sk, w, kw in PRELOAD_TILES]
    return [dataclasses.replace(c, preload=False) for c in pre] + pre


def main() -> None:
    ms, out = ms_arg(__doc__, "1,4,8")
    family_sweep(ms, lambda cfg: "preload" if cfg.preload else "stepped", ["stepped", "preload"], out, "preload",
                 configs)


if __name__ == "__main__":
    main()
