"""32 weight rows per warp (`TileConfig.bm = 32`: two A fragments per B fragment) against the
8 / 16-row tiles, per Llama-3-8B shape and token count (GPU).

At 16 tokens a warp of the 16-row kernel loads 4x as many activation bytes as weight bytes
(`xloads.py`: removing those loads takes the 16-token step from 3.05 to 2.10 ms); 32 rows per warp
halve that ratio. Each tile is checked against the torch reference and for bit-identical reruns,
then timed over enough weight copies to exceed L2 (blocks16 layout, as the engine runs it).

    PYTHONPATH=. python benchmarks/mma_ablations/rows32.py --ms 1,2,4,8,16 --out benchmarks/results
"""
from sweep import family_sweep, ms_arg


def main() -> None:
    ms, out = ms_arg(__doc__, "1,2,4,8,16")
    family_sweep(ms, lambda cfg: "32 rows" if cfg.bm == 32 else "8/16 rows", ["8/16 rows", "32 rows"], out, "rows32")


if __name__ == "__main__":
    main()
