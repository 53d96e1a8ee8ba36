"""A/B any settings of the kernel switches on the engine's graphed decode step (GPU), in one process.

Each `--side LABEL=SWITCHES` is one setting (`gearshift/kernels/switches.py` names, as in `e2e_ab.py`:
`decode_attention_min_batch=3,decode_attention_launch=off`; an empty list is the shipped defaults). For
every batch and context the decode step is captured once per side (`DecodeStepTimer`, graphs keyed by
the switches) and timed in alternating rounds; the table gives each side's median ms and its median
per-round ratio to the first side. `trigger_matrix.py` is the same for the PDL trigger switches' full
matrix; whole generations (prefill, host work) are `e2e_ab.py`'s.

Stop 46 (decode attention from one sequence, without PDL at 1-2 rows):

    PYTHONPATH=. python benchmarks/step_ab.py --mode w4a16 --batches 1,2,3,4,16 --context 512,2048 \\
        --side sdpa=decode_attention_min_batch=3 --side shipped= --side start=decode_attention_launch=start \\
        --rounds 5 --tag stop46
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from e2e_ab import parse_switches  # noqa: E402
from kernel_bench import tag_suffix, write_json  # noqa: E402
from trigger_matrix import alternate, ratio_table, summarize  # noqa: E402


def parse_sides(specs: list[str]) -> dict[str, dict]:
    """['sdpa=decode_attention_min_batch=3', 'shipped='] -> {label: switches}."""
    from gearshift.kernels import switches

    sides = {}
    for spec in specs:
        label, sep, rest = spec.partition("=")
        if not sep or not label:
            raise SystemExit(f"--side {spec!r}: expected LABEL=SWITCHES (SWITCHES may be empty)")
        if label in sides:
            raise SystemExit(f"--side {label!r} given twice")
        values = parse_switches(rest)
        unknown = set(values) - set(dict(switches.state()))
        if unknown:
            raise SystemExit(f"--side {label!r}: unknown switches {sorted(unknown)}")
        sides[label] = values
    if len(sides) < 2:
        raise SystemExit("give at least two --side settings")
    return sides


def main() -> None:
    from gearshift.kernels import switches

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", action="append", default=[], metavar="LABEL=SWITCHES",
                    help="one setting: a label, '=', then NAME=VALUE[,NAME=VALUE...] (repeat; the first is the base)")
    ap.add_argument("--map", action="append", default=[], metavar="LABEL=PATH",
                    help="side LABEL runs under this policy map (a what-if map, e.g. from policy_merge.py --foreign); "
                    "the other sides run under the map the engine loads on this GPU")
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--mode", default="w4a16", help="w4a16, w4a8, w4a4 or w4a8-fp8")
    ap.add_argument("--int4-prog", action="store_true", help="int4-prog weights (how W4A8 / W4A4 run in the engine)")
    ap.add_argument("--batches", default="1,2,4,16")
    ap.add_argument("--context", default="512", help="cached tokens per sequence (comma-separated for several)")
    ap.add_argument("--tokens", type=int, default=1,
                    help="new tokens per sequence: 1 is a decode step, gamma + 1 a QSPEC verify pass (all logits)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    sides = parse_sides(a.side)
    maps = dict(spec.partition("=")[::2] for spec in a.map)
    if set(maps) - set(sides) or not all(maps.values()):
        raise SystemExit(f"--map {a.map}: LABEL=PATH for labels among the sides {sorted(sides)}")
    if not torch.cuda.is_available():
        raise SystemExit("step_ab.py times CUDA graphs: it needs a GPU")

    from e2e import model_for
    from gearshift.dispatch import AdaptiveDispatcher, get_dispatcher
    from gearshift.dispatch.policy import device_slug, load_map_file
    from gearshift.model.step_timer import DecodeStepTimer

    model = model_for({}, a.preset, a.mode, a.int4_prog)
    dispatchers = {label: AdaptiveDispatcher(load_map_file(maps[label]), autoload=False) if label in maps
                   else get_dispatcher() for label in sides}  # (graphs are keyed by the dispatcher too)
    before = dict(switches.state())
    labels = list(sides)
    result = {"device": torch.cuda.get_device_name(), "mode": a.mode, "int4_prog": a.int4_prog, "tokens": a.tokens,
              "sides": sides, "maps": maps, "base": labels[0], "cases": {}}
    try:
        for ctx in (int(c) for c in a.context.split(",")):
            for b in (int(x) for x in a.batches.split(",")):
                timer = DecodeStepTimer(model, a.mode, b, ctx, max_graphs=len(sides) + 1, tokens=a.tokens)
                def run(label, timer=timer):
                    switches.set_switches(**(before | sides[label]))
                    return timer.ms(dispatchers[label])

                times = alternate(labels, a.rounds, run)
                result["cases"][f"{b}x{ctx}"] = summarize(times, labels[0])
                del timer
                torch.cuda.empty_cache()
    finally:
        switches.set_switches(**before)
    path = write_json(a.out, f"step_ab_{device_slug(result['device'])}_{a.mode}{tag_suffix(a.tag)}.json", result)
    print(f"wrote {path}")
    print(ratio_table("batch x context", result["cases"], labels))


if __name__ == "__main__":
    main()
