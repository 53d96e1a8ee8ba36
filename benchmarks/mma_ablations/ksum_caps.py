"""2-warp fragment tiles with the shared-memory K sum (`TileConfig.ksum`) under register caps (GPU).

Without a cap ptxas gives the 2-warp K-sum tile 64 registers and 8 bytes of spill (66 and none without
K sum), and in stop 42's profiles its twin lost on gate_up at 1..4 tokens (25.64 against 24.01 us at one
token). With `.maxnreg` 72 / 80 / 96 it allocates 72 / 80 / 89-96 registers and spills nothing. This
times the plain tile, its K-sum twin and the capped twins per Llama-3-8B shape and token count, each
checked against the reference and for bit-identical reruns.

    PYTHONPATH=. python benchmarks/mma_ablations/ksum_caps.py --ms 1,2,4 --out benchmarks/results
"""
from dataclasses import replace

from gearshift.kernels.config import TileConfig
from sweep import family_sweep, ms_arg

BASE = (TileConfig(16, 0, 128, 1, 2, 1, kwarps=2), TileConfig(16, 0, 128, 1, 4, 1, kwarps=4))
CAPS = (0, 72, 80, 96)


def family(cfg: TileConfig) -> str:
    return f"ksum r{cfg.maxnreg}" if cfg.ksum else "plain"


def configs(m: int) -> list[TileConfig]:
    return list(BASE) + [replace(c, ksum=True, maxnreg=r) for c in BASE for r in CAPS]


def main() -> None:
    ms, out = ms_arg(__doc__, "1,2,4")
    family_sweep(ms, family, ["plain"] + [f"ksum r{r}" for r in CAPS], out, "ksum_caps", configs)


if __name__ == "__main__":
    main()
