"""Where the decode step's kernels let their PDL successors in, judged on the engine's own graphed decode
step (GPU): every combination of the fragment GEMV's trigger (`switches.gemv_trigger`: the rule, or one
point for every launch) and the small kernels' trigger (`switches.small_trigger`: before or after their
wait), at each batch, in alternating rounds on one model.

Why: stops 36-44 found early GEMV triggers that win on chains of linears (`policy_ab.py`) and lose in the
engine, because the norm or SwiGLU after a linear let the next linear in at its own start (stop 44,
`engine_trace.py`). This measures whether letting the small kernels trigger after their wait removes that.
The bits never change with either switch; this compares time only (`DecodeStepTimer`, 0.5% repeatability).

    PYTHONPATH=. python benchmarks/trigger_matrix.py --mode w4a16 --batches 1,2,4,8,16 --gemv rule,1,2 \\
        --small start,wait --rounds 3 --tag stop45
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from kernel_bench import tag_suffix, write_json  # noqa: E402


def parse_gemv(spec: str) -> list[int]:
    """'rule,1,2' -> [-1, 1, 2] (gemv_trigger values: -1 is the shipped rule)."""
    out = []
    for item in filter(None, spec.split(",")):
        v = -1 if item == "rule" else int(item)
        if v not in (-1, 0, 1, 2, 3):
            raise SystemExit(f"--gemv: {item!r} is not 'rule' or a trigger point 0-3")
        out.append(v)
    return out


def combos(gemv: list[int], small: list[str]) -> list[tuple[int, str]]:
    return list(itertools.product(gemv, small))


def label(combo: tuple[int, str]) -> str:
    g, s = combo
    return f"gemv={'rule' if g < 0 else g},small={s}"


def alternate(labels: list[str], rounds: int, run) -> dict[str, list[float]]:
    """run(label) -> ms for every label, `rounds` times, in alternating order (A, B, .. then .., B, A) so
    drift hits every label alike; the ms per label in round order."""
    times: dict[str, list[float]] = {label: [] for label in labels}
    for r in range(rounds):
        for label in (labels if r % 2 == 0 else labels[::-1]):
            times[label].append(run(label))
    return times


def summarize(times: dict[str, list[float]], base: str) -> dict[str, dict]:
    """Median ms per combination, and its ratio to `base`'s median (per-round ratios' median too)."""
    b = times[base]
    out = {}
    for name, ts in times.items():
        out[name] = {"ms": statistics.median(ts), "ratio": statistics.median(ts) / statistics.median(b),
                     "round_ratio": statistics.median(t / u for t, u in zip(ts, b)), "rounds": ts}
    return out


def ratio_table(first: str, rows: dict, labels: list[str]) -> str:
    """`summarize` rows as text: each label's median ms and per-round ratio to the first label."""
    w = max(len(first), *(len(str(k)) for k in rows))
    lines = [f"{first:>{w}} " + " ".join(f"{lb:>24}" for lb in labels)]
    lines += [f"{k:>{w}} " + " ".join(f"{row[lb]['ms']:>12.3f} ({row[lb]['round_ratio']:.3f})".rjust(24) for lb in labels)
              for k, row in rows.items()]
    return "\n".join(lines)


def main() -> None:
    from gearshift.kernels import switches

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--mode", default="w4a16", help="w4a16, w4a8, w4a4 or w4a8-fp8")
    ap.add_argument("--int4-prog", action="store_true", help="int4-prog weights (how W4A8 / W4A4 run in the engine)")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--gemv", default="rule,1,2", help="fragment GEMV triggers: 'rule' or 0-3 (0 exit, 1 start, "
                    "2 after the main loop, 3 right after the wait)")
    ap.add_argument("--small", default=",".join(switches.SMALL_TRIGGERS), help="small kernels' triggers: start, wait")
    ap.add_argument("--context", type=int, default=512, help="cached tokens per sequence")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    gemv = parse_gemv(a.gemv)
    small = [s for s in a.small.split(",") if s]
    bad = set(small) - set(switches.SMALL_TRIGGERS)
    if bad:
        raise SystemExit(f"--small: unknown {sorted(bad)}; known: {switches.SMALL_TRIGGERS}")
    if not torch.cuda.is_available():
        raise SystemExit("trigger_matrix.py times CUDA graphs: it needs a GPU")

    from e2e import model_for
    from gearshift.dispatch import get_dispatcher
    from gearshift.model.step_timer import DecodeStepTimer

    cs = combos(gemv, small)
    base = label(cs[0])
    model = model_for({}, a.preset, a.mode, a.int4_prog)
    dispatcher = get_dispatcher()
    before = switches.state()
    result = {"device": torch.cuda.get_device_name(), "mode": a.mode, "int4_prog": a.int4_prog,
              "context": a.context, "base": base, "batches": {}}
    try:
        for b in (int(x) for x in a.batches.split(",")):
            timer = DecodeStepTimer(model, a.mode, b, a.context, max_graphs=len(cs) + 1)  # a capture per combination
            by_label = {label(c): c for c in cs}

            def run(name, timer=timer):
                switches.set_switches(gemv_trigger=by_label[name][0], small_trigger=by_label[name][1])
                return timer.ms(dispatcher)

            times = alternate(list(by_label), a.rounds, run)
            result["batches"][b] = summarize(times, base)
            del timer
            torch.cuda.empty_cache()
    finally:
        for k, v in before:
            switches.set_switches(**{k: v})
    from gearshift.dispatch.policy import device_slug

    path = write_json(a.out, f"trigger_matrix_{device_slug(result['device'])}_{a.mode}{tag_suffix(a.tag)}.json", result)
    print(f"wrote {path}")
    print(ratio_table("batch", result["batches"], [label(c) for c in cs]))


if __name__ == "__main__":
    main()
