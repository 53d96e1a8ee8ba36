"""How far the fragment kernel's dequantize-first blocks (int4 groups of 32 / 64) sit from exact arithmetic.

For each test tile, group (32, 64, and 128 for the scale-after form) and token count, a random store (fp16 scales,
as GGUF Q4_0 / Q4_1 hold them) and bf16 inputs: the relative error of `mma_gemv` against x @ W^T with W the weights as
the block feeds them to its MMAs (each rounded once to bf16, `tests/test_kernels_int4_mma.dequantized_weights`), and
against `linear_reference`, and whether a second launch gives the same bits.

Usage on the GPU: PYTHONPATH=. python benchmarks/dequant_error.py [--layout rows|blocks16] [--out DIR]
writes DIR/dequant_error_<device>.json, prints a table last.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gearshift.dispatch.policy import device_slug  # noqa: E402
from gearshift.kernels.config import TileConfig  # noqa: E402
from gearshift.kernels.int4_mma_gemv import mma_gemv, mma_gemv_supports  # noqa: E402
from gearshift.kernels.reference import linear_reference  # noqa: E402
from gearshift.quant.int4 import quantize_int4  # noqa: E402
from test_kernels_int4_mma import dequantized_weights  # noqa: E402

TILES = [TileConfig(16, 0, 128, 1, 4, 1), TileConfig(8, 0, 128, 2, 2, 1, prefetch=True),
         TileConfig(16, 0, 128, 1, 8, 1, kwarps=8, preload=True, ksum=True),
         TileConfig(32, 0, 128, 1, 4, 1, kwarps=4, prefetch=True), TileConfig(32, 0, 128, 1, 4, 1, kwarps=2, xshare=True),
         TileConfig(16, 0, 128, 1, 16, 1, kwarps=8, pairs=True, xshare=True, ksum=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layout", default="rows", choices=["rows", "blocks16"])
    ap.add_argument("--out", default="benchmarks/results", help="folder for the JSON")
    a = ap.parse_args()
    n, k = (200 if a.layout == "rows" else 208), 2048
    rows = []
    for group in (32, 64, 128):
        for cfg in TILES:
            g = torch.Generator().manual_seed(group + cfg.warps + cfg.bm)
            host = quantize_int4(torch.randn(n, k, generator=g), group)
            store = host.cuda().to_layout(a.layout)
            w = dequantized_weights(host, torch.bfloat16).cuda().double()
            for m in (1, 9, 40):
                if not mma_gemv_supports(store, cfg, m, torch.bfloat16):
                    continue
                x = torch.randn(m, k, generator=g).to("cuda", torch.bfloat16)
                y = mma_gemv(x, store, cfg)
                want = x.double() @ w.T
                ref = linear_reference(x.float(), store, None)
                rows.append({"group": group, "tile": cfg.key(), "m": m,
                             "vs_dequantized": ((y.double() - want).norm() / want.norm()).item(),
                             "vs_reference": ((y.float() - ref).norm() / ref.norm()).item(),
                             "reproducible": torch.equal(mma_gemv(x, store, cfg), y)})
    name = torch.cuda.get_device_name()
    out = Path(a.out) / f"dequant_error_{a.layout}_{device_slug(name)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": name, "layout": a.layout, "rows": rows}, indent=1))
    print(f"{name}; {a.layout}; relative errors of mma_gemv (bf16), worst over tiles and M = 1 / 9 / 40")
    print(f"{'group':>5} {'vs dequantized W':>17} {'vs reference':>13} {'reproducible':>13}")
    for group in (32, 64, 128):
        rs = [r for r in rows if r["group"] == group]
        print(f"{group:>5} {max(r['vs_dequantized'] for r in rs):17.2e} {max(r['vs_reference'] for r in rs):13.2e} "
              f"{all(r['reproducible'] for r in rs)!s:>13}")


if __name__ == "__main__":
    main()
