"""The split SwiGLU-codes kernel's barrier, before and after stop 50, on the graphed decode step (GPU).

Side "old" runs `silu_mul.py` as it was at --rev (stop 49: an atomic max, arrival and finish counters,
and the last program resetting the row's words); "new" the current kernel (partial maxima in slots,
an int64 arrival counter never reset). "new_w8" / "new_w16" also give the RMSNorms that emit codes
8 / 16 warps (switch `norm_codes_warps`). One process, one model, rounds
alternating between the sides; ms per step and each side's ratio to "old".

    PYTHONPATH=. python benchmarks/swiglu_barrier_ab.py --mode w4a8 --batches 1,4,8,16 --tag stop50
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _old_module(rev: str):
    src = subprocess.run(["git", "show", f"{rev}:gearshift/kernels/silu_mul.py"], capture_output=True, text=True,
                         check=True).stdout
    path = os.path.join(tempfile.mkdtemp(), "silu_mul_old.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("silu_mul_old", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="w4a8", help="a mode whose down projection takes SwiGLU's codes")
    ap.add_argument("--batches", default="1,4,8,16")
    ap.add_argument("--rev", default="d4881c2", help="the commit whose kernel side 'old' runs")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("swiglu_barrier_ab.py times CUDA graphs: it needs a GPU")

    from engine_step import EngineStep

    from gearshift.dispatch import get_dispatcher
    from gearshift.kernels import switches
    from gearshift.model import transformer

    new = transformer.silu_mul_codes_triton
    sides = {"old": (_old_module(args.rev).silu_mul_codes_triton, None), "new": (new, None),
             "new_w8": (new, 8), "new_w16": (new, 16)}
    rows, models = [], {}
    for b in (int(x) for x in args.batches.split(",")):
        timers = {}
        for name, (fn, warps) in sides.items():
            transformer.silu_mul_codes_triton = fn  # the graph captured with this kernel keeps it
            switches.set_switches(norm_codes_warps=warps or 0)
            timers[name] = EngineStep("llama3-8b", args.mode, True, b, models=models)
            timers[name].ms(get_dispatcher(), reps=3, trials=1)
        transformer.silu_mul_codes_triton = new
        times = {n: [] for n in sides}
        for _ in range(args.rounds):
            for n, (_, warps) in sides.items():
                switches.set_switches(norm_codes_warps=warps or 0)  # (graphs are keyed by the switches)
                times[n].append(timers[n].ms(get_dispatcher(), reps=50, trials=1))
        switches.set_switches(norm_codes_warps=0)
        row = {"mode": args.mode, "batch": b, "ms": {n: statistics.median(v) for n, v in times.items()},
               "rounds": times}
        rows.append(row)
        print(f"{args.mode} batch {b}: old {row['ms']['old']:.3f} ms; " +
              ", ".join(f"{n} {row['ms'][n] / row['ms']['old']:.3f}" for n in sides if n != "old"), flush=True)
    from kernel_bench import tag_suffix, write_json

    from gearshift.dispatch.policy import device_slug

    dev = torch.cuda.get_device_name()
    path = write_json(args.out, f"swiglu_barrier_ab_{device_slug(dev)}{tag_suffix(args.tag)}.json",
                      {"device": dev, "args": vars(args), "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
