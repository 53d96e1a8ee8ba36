"""Partial token tiles: each Llama-3-8B linear through the map's W4A16 pick at token counts that leave its last
token tile part empty, with the activations read as they are and padded to whole tiles (GPU).

Why (stop 71): the wgmma kernels TMA their activations in boxes of BM token rows, and a box of which many rows lie
past x read slowly on the H200: gate_up took 62.9 us at 33 tokens against 43.8 at 64. `w4a16_wgmma.tma_rows` pads
such inputs (`pad_rows`, the same bits); this times each shape three ways, at the switch's settings:
"as_is" (PAD_ABSENT_EIGHTHS=-1), "padded" (every partial tile padded) and "rule" (the shipped thresholds). Whole
steps are `policy_ab.py --set-a PAD_ABSENT_EIGHTHS=-1` (the rule as side B).

    python benchmarks/partial_tiles.py --map gearshift/data/policy/NVIDIA_H200.json --out benchmarks/results
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_bench import tag_suffix, write_json  # noqa: E402

from gearshift.dispatch.dispatcher import AdaptiveDispatcher  # noqa: E402
from gearshift.dispatch.policy import device_slug, load_map_file  # noqa: E402
from gearshift.dispatch.profiler import PRESETS, random_store, time_us  # noqa: E402
from gearshift.kernels import w4a16_wgmma as W16  # noqa: E402
from gearshift.quant.modes import MODES  # noqa: E402

#: (PAD_ABSENT_EIGHTHS, PAD_ONE_TILE_EIGHTHS) of each way
WAYS = {"as_is": (-1, -1), "padded": (0, 0), "rule": (W16.PAD_ABSENT_EIGHTHS, W16.PAD_ONE_TILE_EIGHTHS)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--map", required=True, help="policy map JSON (loaded as the engine loads it)")
    ap.add_argument("--m", default="33,40,47,48,64,65,80,100,112,128,129,160,200,256,257,300",
                    help="token counts, comma-separated")
    ap.add_argument("--copies", type=int, default=4, help="distinct weight copies per shape (cold L2)")
    ap.add_argument("--out", default=".", help="directory for partial_tiles_<device>.json")
    ap.add_argument("--tag", default="", help="suffix of the result file name")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("partial_tiles.py times GPU kernels: no CUDA device here")
    d = AdaptiveDispatcher(load_map_file(a.map), autoload=False)
    act = MODES["w4a16"].act
    res = {}
    for name, n, k in PRESETS["llama3-8b"]["shapes"]:
        stores = [random_store("int4", n, k, 128, "cuda") for _ in range(a.copies)]
        for m in (int(v) for v in a.m.split(",")):
            c = d.choose(stores[0], act, m)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            row, ys = {"pick": f"{c.strategy} {c.config}", "absent": -m % c.config.bm if c.config.bm else 0}, []
            for way, (eighths, one_tile) in WAYS.items():
                W16.PAD_ABSENT_EIGHTHS, W16.PAD_ONE_TILE_EIGHTHS = eighths, one_tile
                row[way] = time_us([lambda s=s: d.linear(x, s, act) for s in stores])
                ys.append(d.linear(x, stores[0], act))
            W16.PAD_ABSENT_EIGHTHS, W16.PAD_ONE_TILE_EIGHTHS = WAYS["rule"]
            if not all(torch.equal(y, ys[0]) for y in ys):
                raise SystemExit(f"{name} M={m}: padding changed the output bits")
            res[f"{name}:{m}"] = row
            print(f"{name:8} M={m:4} absent {row['absent']:3}  as is {row['as_is']:7.2f} us  padded "
                  f"{row['padded']:7.2f}  rule {row['rule']:7.2f}  {c.strategy} bm{c.config.bm} bn{c.config.bn}",
                  flush=True)
    dev = torch.cuda.get_device_name()
    write_json(a.out, f"partial_tiles_{device_slug(dev)}{tag_suffix(a.tag)}.json",
               {"device": dev, "map": a.map, "ways": WAYS, "us": res})


if __name__ == "__main__":
    main()
