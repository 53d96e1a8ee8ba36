"""Prefill forwards with the switch `tile_room` on and off, alternately, in one process (GPU).

Why (stop 72): the linears' producers allocate whole token tiles (`kernels/tile_room.py`) so that the wgmma kernels'
TMA boxes read the rows past a partial tile in place instead of out of bounds or from a zero-padded copy. Graphed
prefills run padded to a token bucket (24, 32, 48, 64, 96, 128, 192, 256, 384, ...), so of those only 24, 48, 96,
192 and 384 rows leave a tile part empty; eager forwards (more than `graph_max_rows` rows) run their own count.
For each mode, batch and prompt length this times the forward (graph replay where it is graphed, median of
alternating rounds) with the switch on and off, and checks that the two give the same logits bit for bit.

    PYTHONPATH=. python benchmarks/tile_room_ab.py --lengths 20,40,90,150,300,1100,1500 --out benchmarks/results
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e import model_for  # noqa: E402
from kernel_bench import tag_suffix, write_json  # noqa: E402
from prefill_graphs import wall_ms  # noqa: E402

from gearshift.dispatch.policy import device_slug  # noqa: E402
from gearshift.kernels import switches  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--modes", default="w4a16,w4a8", help="comma-separated (w4a8 runs on int4-prog weights)")
    ap.add_argument("--lengths", default="20,40,90,150,300,1100,1500", help="prompt tokens per sequence")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5, help="alternating on / off rounds (medians)")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tile_room_ab.py times a GPU model: no CUDA device here")
    from gearshift.model.cuda_graphs import GraphRunner, token_bucket

    models, rows = {}, []
    lengths = [int(v) for v in a.lengths.split(",")]
    for mode in a.modes.split(","):
        model = model_for(models, a.preset, mode, int4_prog=mode in ("w4a8", "w4a4"))
        model.use_cuda_graphs = True
        model._graphs = GraphRunner()
        cache = model.new_cache(a.batch, max(lengths) + 64)
        for t in lengths:
            ids = torch.randint(0, model.config.vocab_size, (a.batch, t), device="cuda")

            def fwd():
                for b in range(a.batch):
                    cache.reset(b)
                return model(ids, cache, [0] * a.batch, [t] * a.batch, mode=mode, logits="last")

            times, outs = {True: [], False: []}, {}
            for _ in range(2):  # each side's first sight (eager) and capture
                for on in (True, False):
                    switches.set_switches(tile_room=on)
                    fwd()
            for _ in range(a.rounds):
                for on in (True, False):
                    switches.set_switches(tile_room=on)
                    times[on].append(wall_ms(fwd))
                    outs[on] = fwd()
            switches.set_switches(tile_room=True)
            graphed = a.batch * token_bucket(t) <= model.graph_max_rows
            row = {"mode": mode, "batch": a.batch, "tokens": t, "rows": a.batch * (token_bucket(t) if graphed else t),
                   "graphed": graphed, "room_ms": statistics.median(times[True]),
                   "no_room_ms": statistics.median(times[False]), "room_rounds_ms": times[True],
                   "no_room_rounds_ms": times[False], "same_logits": outs[True].equal(outs[False])}
            row["room_over_no_room"] = row["room_ms"] / row["no_room_ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    dev = torch.cuda.get_device_name()
    write_json(a.out, f"tile_room_ab_{device_slug(dev)}{tag_suffix(a.tag)}.json", {"device": dev, "rows": rows})
    print(f"{'mode':6} {'tokens':>6} {'rows':>5} {'room ms':>8} {'no room':>8} {'ratio':>6} same")
    for r in rows:
        print(f"{r['mode']:6} {r['tokens']:6} {r['rows']:5} {r['room_ms']:8.3f} {r['no_room_ms']:8.3f} "
              f"{r['room_over_no_room']:6.3f} {r['same_logits']}")


if __name__ == "__main__":
    main()
