"""Choose each shape's small-M kernel in the context of the whole step, not of its own chain (GPU).

`gearshift profile` times every candidate of a shape in a chain of that shape alone. A decode step
chains qkv -> o -> gate_up -> down, and a kernel's cost depends on its neighbours (how early its
successor's CTAs can start under PDL, whose registers still occupy the SMs), so the profile's
winners need not be the step's. This runs a coordinate descent over the profile's best
`--top` candidates per shape: with the other shapes at their current choice, each alternative of
one shape is timed on the whole 32-layer step (128 Llama-3-8B linears through the dispatcher,
CUDA-graph replay, distinct random weights); the best is re-timed against the current choice,
alternating, and taken if it is faster by more than `--min-gain`. Finally the found map and the
shipped one are timed alternately (`--rounds`). Writes the search log and the map with the found
entries (`policy_merge.py` can take them into the shipped map after an A/B with `policy_ab.py`).

With --engine the target is the engine's graphed decode step at batch M instead (`engine_step.py`): there
each linear's neighbours are norms, attention and SwiGLU, not other linears (stop 44: the linears-only
search took 4 tokens' step to 0.957 and the engine's decode step only to 0.99-1.01).

    PYTHONPATH=. python benchmarks/step_search.py --mode w4a16 --m 1,2 --top 6 --out benchmarks/results
    PYTHONPATH=. python benchmarks/step_search.py --engine --mode w4a16 --m 8,16 --top 1 --triggers 0,1,2,3  # PDL points
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_step import EngineStep  # noqa: E402
from kernel_bench import Model, codes_step_fn, kernel_switches, producer_codes, tag_suffix, time_step, write_json  # noqa: E402

from gearshift.dispatch.dispatcher import AdaptiveDispatcher  # noqa: E402
from gearshift.dispatch.policy import PolicyMap, device_slug  # noqa: E402
from gearshift.dispatch.step_search import adopt, candidates, coordinate_descent, with_choices, with_triggers  # noqa: E402
from gearshift.dispatch.profiler import PRESETS  # noqa: E402
from gearshift.quant.modes import MODES  # noqa: E402
from gearshift.jsonfile import read_json  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="w4a16", choices=("w4a16", "w4a8", "w4a4"))
    ap.add_argument("--m", default="1,2")
    ap.add_argument("--policy", default="gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
    ap.add_argument("--top", type=int, default=6, help="candidates per shape (the shipped one included)")
    ap.add_argument("--passes", type=int, default=1, help="sweeps over the shapes (stops early when one changes nothing)")
    ap.add_argument("--confirm", type=int, default=4, help="alternating re-timings before a change is taken")
    ap.add_argument("--min-gain", type=float, default=0.005, help="smallest confirmed gain (fraction) that is taken")
    ap.add_argument("--rounds", type=int, default=5, help="final alternating rounds, found vs shipped")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--set", default="", metavar="[MODULE.]NAME=VALUE[,...]",
                    help="kernel switches held for the whole search, e.g. int4_mma_gemv.TRIGGER=2 to choose tiles "
                    "under another PDL trigger than int4_mma_gemv.pdl_trigger's")
    ap.add_argument("--engine", action="store_true",
                    help="time each candidate on the engine's graphed decode step at batch M (engine_step.py: norms, "
                    "attention, SwiGLU and lm_head around the linears) instead of on the 128 linears alone")
    ap.add_argument("--context", type=int, default=512, help="--engine: cached tokens each sequence attends to")
    ap.add_argument("--against", metavar="MAP", help="compare the found picks in the final alternating rounds with this "
                    "map's picks instead of --policy's (e.g. the shipped map when --policy is a re-profiled one)")
    ap.add_argument("--triggers", default="", metavar="LIST",
                    help="also try each fragment-GEMV candidate with these PDL trigger points in its tile "
                    "(TileConfig.trigger: 0 exit, 1 start, 2 after the main loop, 3 after the wait, -1 the rule by M), "
                    "e.g. 0,1,2,3 with --top 1 searches the shipped tiles' triggers alone")
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    for (mod, attr), v in kernel_switches(a.set).items():
        setattr(mod, attr, v)
    s8 = a.mode != "w4a16"  # the int8-code modes run on int4-prog weights, as the engine's records do
    pm_json = read_json(a.policy)
    shipped = PolicyMap.from_json(pm_json)
    shapes, layers = PRESETS["llama3-8b"]["shapes"], PRESETS["llama3-8b"]["layers"]
    model = None if a.engine else Model("int4p" if s8 else "int4", shapes, layers, 128, torch.bfloat16, "blocks16")
    models = {}  # --engine: the random-weight engine model, built once for every M
    act = MODES[a.mode].act
    keys = [f"{a.mode}:g128:{n}x{k}" for _, n, k in shapes]
    res = {"device": torch.cuda.get_device_name(), "mode": a.mode, "int4_prog": s8, "set": a.set,
           "target": f"engine decode step, context {a.context}" if a.engine else "128 linears", "m": {}}
    found = PolicyMap.from_json(pm_json)
    against = PolicyMap.from_json(read_json(a.against)) if a.against else None
    for m in (int(v) for v in a.m.split(",")):
        if a.engine:
            engine = EngineStep("llama3-8b", a.mode, s8, m, a.context, models=models)
        else:
            xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, _, k in shapes]
            d0 = AdaptiveDispatcher(shipped, autoload=False)
            codes = producer_codes(d0, shapes, model.stores[0], xs, act, m) if act is not None else [None] * len(shapes)

        def step_ms(choices: dict[str, str]) -> float:
            d = AdaptiveDispatcher(with_choices(shipped, choices, m), autoload=False)
            if a.engine:
                return engine.ms(d)
            return time_step(codes_step_fn(model, xs, d, act, codes))

        cands = {key: candidates(shipped, key, m, a.top) for key in keys}
        if a.triggers:
            cands = {key: with_triggers(c, [int(t) for t in a.triggers.split(",")]) for key, c in cands.items()}
        start = {key: c[0] for key, c in cands.items()}
        print(f"M={m}: shipped {step_ms(start):.3f} ms", flush=True)
        cur, log = coordinate_descent(cands, step_ms, passes=a.passes, confirm=a.confirm, min_gain=a.min_gain)
        for e in log:
            if "ratio" in e:
                print(f"  {e['key']}: best alternative {statistics.median(e['confirm_best']):.3f} vs "
                      f"{statistics.median(e['confirm_cur']):.3f} ({e['ratio']:.3f}){' taken' if e['taken'] else ''}")
        base = start
        if a.against:
            picks = {key: candidates(against, key, m, 1) for key in keys}
            missing = [key for key, c in picks.items() if not c]
            if missing:
                raise SystemExit(f"--against {a.against} has no pick at M={m} for {missing}")
            base = {key: c[0] for key, c in picks.items()}
        tf, ts = [], []
        for _ in range(a.rounds):
            ts.append(step_ms(base))
            tf.append(step_ms(cur))
        ratio = statistics.median(tf) / statistics.median(ts)
        res["m"][m] = {"shipped_ms": ts, "found_ms": tf, "ratio": ratio, "choices": cur, "against": a.against or a.policy,
                       "changed": [k for k in keys if cur[k] != start[k]], "log": log}
        print(f"M={m}: found {statistics.median(tf):.3f} ms vs shipped {statistics.median(ts):.3f} ({ratio:.3f}); "
              f"changed {res['m'][m]['changed']}", flush=True)
        adopt(found, cur, m)  # the shipped entries of unchanged keys stay as they are
    tag = tag_suffix(a.tag)
    slug = device_slug(res["device"])
    out = write_json(a.out, f"step_search_{slug}_{a.mode}{tag}.json", res).parent
    found.meta = dict(found.meta) | {"step_search": f"{a.mode} M={a.m}{tag}" + (f" with {a.set}" if a.set else "")}
    print(found.save(out / f"policy_step_search_{slug}_{a.mode}{tag}.json.gz"))  # a map with every timing: megabytes


if __name__ == "__main__":
    main()
