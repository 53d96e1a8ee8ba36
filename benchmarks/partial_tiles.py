"""Partial token tiles: each Llama-3-8B linear through the map's pick (W4A16, or W4A8 on int4-prog weights) at token
counts that leave its last token tile part empty, with the activations read as they are and padded to whole tiles
(GPU).

Why (stop 71): the wgmma kernels TMA their activations in boxes of BM token rows, and a box of which many rows lie
past x read slowly on the H200: gate_up took 62.9 us at 33 tokens against 43.8 at 64. `w4a16_wgmma.tma_rows` pads
such inputs (`pad_rows`, the same bits), and `w4a8_progressive` its int8 codes (stop 72). This times each shape four
ways: "as_is" (PAD_ABSENT_EIGHTHS=-1 / PAD_ABSENT_ROWS=-1), "padded" (every partial tile padded) and "rule" (the copy
thresholds), each with the switch `tile_room` off, and "room" (the input in a buffer of whole tiles whose further
rows the kernel reads in place, as from the engine's producers since stop 72). Whole steps: `policy_ab.py`, whose
inputs sit in such buffers, with `--set-a PAD_ABSENT_EIGHTHS=-1,switches.tile_room=0` (W4A8:
`w4a8_progressive.PAD_ABSENT_ROWS=-1,switches.tile_room=0`) and the engine's settings as side B.

    python benchmarks/partial_tiles.py --map gearshift/data/policy/NVIDIA_H200.json --out benchmarks/results
    python benchmarks/partial_tiles.py --map gearshift/data/policy/NVIDIA_H200.json --mode w4a8 \\
        --m 65,100,129,200,257
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
from gearshift.kernels import switches  # noqa: E402
from gearshift.kernels import w4a8_progressive as P  # noqa: E402
from gearshift.kernels.act_quant import ActCodes, codes_qmax, quantize_act_triton  # noqa: E402
from gearshift.kernels import w4a16_wgmma as W16  # noqa: E402
from gearshift.quant.modes import MODES  # noqa: E402

#: the padding switches of each mode's kernels, and their values in each way ("room": the input sits in a buffer of
#: whole 256-row tiles whose rows past it are NaN (W4A16) or other codes (W4A8), read from there at no copy)
SWITCHES = {"w4a16": ((W16, "PAD_ABSENT_EIGHTHS"), (W16, "PAD_ONE_TILE_EIGHTHS")), "w4a8": ((P, "PAD_ABSENT_ROWS"),)}
WAYS = {mode: {"as_is": (-1,) * len(sw), "padded": (0,) * len(sw), "rule": tuple(getattr(*s) for s in sw),
               "room": tuple(getattr(*s) for s in sw)} for mode, sw in SWITCHES.items()}
ROOM_ROWS = 256


def set_way(mode: str, way: str) -> None:
    for (mod, attr), v in zip(SWITCHES[mode], WAYS[mode][way]):
        setattr(mod, attr, v)
    switches.set_switches(tile_room=way == "room")


def with_room(t: torch.Tensor, fill) -> torch.Tensor:
    """t's values at the start of a buffer of whole ROOM_ROWS-row tiles, the rest filled by `fill`."""
    buf = fill((-(-t.shape[0] // ROOM_ROWS) * ROOM_ROWS, t.shape[1]))
    buf[:t.shape[0]] = t
    return buf[:t.shape[0]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--map", required=True, help="policy map JSON (loaded as the engine loads it)")
    ap.add_argument("--m", default="33,40,47,48,64,65,80,100,112,128,129,160,200,256,257,300",
                    help="token counts, comma-separated")
    ap.add_argument("--mode", default="w4a16", choices=("w4a16", "w4a8"),
                    help="w4a8: int4-prog weights, each linear handed its codes (as the engine's producers do)")
    ap.add_argument("--copies", type=int, default=4, help="distinct weight copies per shape (cold L2)")
    ap.add_argument("--out", default=".", help="directory for partial_tiles_<mode>_<device>.json")
    ap.add_argument("--tag", default="", help="suffix of the result file name")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("partial_tiles.py times GPU kernels: no CUDA device here")
    d = AdaptiveDispatcher(load_map_file(a.map), autoload=False)
    act = MODES[a.mode].act
    kind = "int4p" if a.mode == "w4a8" else "int4"
    res = {}
    for name, n, k in PRESETS["llama3-8b"]["shapes"]:
        stores = [random_store(kind, n, k, 128, "cuda") for _ in range(a.copies)]
        for m in (int(v) for v in a.m.split(",")):
            c = d.choose(stores[0], act, m)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ins = {"x": x, "codes": None}
            room = {"x": with_room(x, lambda sh: torch.full(sh, float("nan"), device="cuda", dtype=x.dtype)),
                    "codes": None}
            if a.mode == "w4a8":
                q, sc = quantize_act_triton(x, act)
                ins["codes"] = ActCodes(q, sc, codes_qmax(act))
                rq = with_room(q, lambda sh: torch.randint(-127, 128, sh, device="cuda", dtype=torch.int8))
                room["codes"] = ActCodes(rq, sc, codes_qmax(act))
            row, ys = {"pick": f"{c.strategy} {c.config}", "absent": -m % c.config.bm if c.config.bm else 0}, []
            for way in WAYS[a.mode]:
                set_way(a.mode, way)
                i = room if way == "room" else ins
                row[way] = time_us([lambda s=s: d.linear(i["x"], s, act, codes=i["codes"]) for s in stores])
                ys.append(d.linear(i["x"], stores[0], act, codes=i["codes"]))
            set_way(a.mode, "room")
            if not all(torch.equal(y, ys[0]) for y in ys):
                raise SystemExit(f"{name} M={m}: padding changed the output bits")
            res[f"{name}:{m}"] = row
            print(f"{name:8} M={m:4} absent {row['absent']:3}  as is {row['as_is']:7.2f} us  padded "
                  f"{row['padded']:7.2f}  rule {row['rule']:7.2f}  room {row['room']:7.2f}  {c.strategy} "
                  f"bm{c.config.bm} bn{c.config.bn}",
                  flush=True)
    dev = torch.cuda.get_device_name()
    write_json(a.out, f"partial_tiles_{a.mode}_{device_slug(dev)}{tag_suffix(a.tag)}.json",
               {"device": dev, "map": a.map, "mode": a.mode, "ways": WAYS[a.mode], "us": res})


if __name__ == "__main__":
    main()
