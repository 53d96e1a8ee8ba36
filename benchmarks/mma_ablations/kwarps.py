"""The fragment kernel's K split inside the CTA (`TileConfig.kwarps`) against the global split-K
tiles, per Llama-3-8B shape and token count (GPU).

Each tile is checked against the torch reference and for bit-identical reruns, then timed over
enough weight copies to exceed L2 (blocks16 layout, as the engine runs it). Prints, per M, the
per-shape best of the global-split tiles, of the in-CTA tiles, and their 32-layer step sums.

    PYTHONPATH=. python benchmarks/mma_ablations/kwarps.py --ms 1,2,4,8,16 --out benchmarks/results
"""
from sweep import family_sweep, ms_arg


def main() -> None:
    ms, out = ms_arg(__doc__, "1,2,4,8,16")
    family_sweep(ms, lambda cfg: "in-CTA" if cfg.kwarps > 1 else "split-K", ["split-K", "in-CTA"], out, "kwarps")


if __name__ == "__main__":
    main()
