"""Re-choose a map's small-M picks on a whole step instead of each shape's own chain.

The profiler times every candidate of a shape in a chain of that shape alone. Under PDL a kernel's cost
depends on its neighbours (how early its successor's programs start, whose registers still occupy the
SMs), so the fastest tile of a shape alone need not be the fastest in a decode step. A coordinate descent
over each shape's fastest profiled candidates settles that: with the other shapes at their current
pick, each alternative of one shape is timed on the whole step, and the best is taken only if
alternating re-timings confirm it faster by more than `min_gain`. What a "step" is stays with the
caller (`time_fn`): the 128 linears of a step (benchmarks/step_search.py) or the model's graphed decode
step (`gearshift profile --refine`, model/step_timer.py), where norms, attention and SwiGLU sit
between the linears. Stop 44 on the H100: at 4 tokens the linears-only picks took the linears to 0.957
and left the engine even; the engine's own picks took it to 0.990.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
from collections.abc import Callable, Sequence

from gearshift.dispatch.policy import Choice, PolicyMap, candidate_name, parse_candidate


def same_candidate(a: str, b: str) -> bool:
    """Two candidate names of the same strategy and tile (key order and defaults aside)."""
    sa, ca = parse_candidate(a)
    sb, cb = parse_candidate(b)
    return sa == sb and (ca.to_dict() if ca else None) == (cb.to_dict() if cb else None)


def candidates(pm: PolicyMap, key: str, m: int, top: int) -> list[str]:
    """The map's pick at (key, m) first, then the fastest other candidates it timed there, `top` in all
    (untimed or failed candidates never)."""
    timed = pm.timings.get(key, {}).get(str(m), {})
    ranked = [n for n, us in sorted(timed.items(), key=lambda kv: kv[1] or 1e9) if us]
    e = pm.lookup(key, m)
    out = [candidate_name(e.strategy, e.config)] if e is not None else []
    for n in ranked:
        if len(out) >= top:
            break
        if not any(same_candidate(n, o) for o in out):
            out.append(n)
    return out


#: the strategies whose launches take `TileConfig.trigger` (the fragment GEMV, `kernels/int4_mma_gemv.py`)
TRIGGERED = ("w4a16_mma", "w4a8_mma", "w4a8_mma_int8")


def with_triggers(cands: list[str], triggers: Sequence[int]) -> list[str]:
    """`cands` plus, for each fragment-GEMV candidate among them, the same tile with each PDL trigger
    point of `triggers` (where the launch lets its successor in: 0 exit, 1 start, 2 after the loop, 3
    after the wait; -1 the rule by M). The bits never change with the trigger, only the timing."""
    out = list(cands)
    for c in cands:
        s, cfg = parse_candidate(c)
        if s not in TRIGGERED or cfg is None:
            continue
        for t in triggers:
            alt = candidate_name(s, dataclasses.replace(cfg, trigger=t))
            if not any(same_candidate(alt, o) for o in out):
                out.append(alt)
    return out


def with_choices(base: PolicyMap, choices: dict[str, str], m: int) -> PolicyMap:
    """A copy of `base` whose bucket m holds `choices` ({key: candidate name}); base is untouched."""
    pm = copy.copy(base)
    pm.entries = {k: list(v) for k, v in base.entries.items()}
    for key, cand in choices.items():
        s, cfg = parse_candidate(cand)
        pm.set(key, m, Choice(s, cfg, None))
    return pm


def coordinate_descent(cands: dict[str, Sequence[str]], time_fn: Callable[[dict[str, str]], float],
                       passes: int = 1, confirm: int = 4, min_gain: float = 0.005,
                       on_try: Callable[[], None] | None = None) -> tuple[dict[str, str], list[dict]]:
    """Search {key: candidates (current pick first)} for the fastest step under `time_fn(choices) -> ms`.

    Per pass and key: every other candidate is timed once with the other keys at their current pick;
    the fastest is re-timed against the current pick `confirm` times, alternating, and taken when the
    median ratio is below 1 - min_gain. Stops after a pass that changed nothing. A candidate whose
    timing raises (a tile this store cannot run) is logged and skipped. Returns (choices, log)."""
    cur = {key: c[0] for key, c in cands.items()}
    log: list[dict] = []
    for p in range(passes):
        changed = False
        for key, options in cands.items():
            tried = {}
            for cand in options:
                if cand == cur[key]:
                    continue
                try:
                    tried[cand] = time_fn(cur | {key: cand})
                except Exception as e:  # noqa: BLE001 - any launch failure only removes the candidate
                    log.append({"pass": p, "key": key, "cand": cand, "error": f"{type(e).__name__}: {e}"[:200]})
                if on_try is not None:
                    on_try()
            if not tried:
                continue
            best = min(tried, key=tried.get)
            taken, ratio, ta, tb = confirmed_faster(time_fn, cur, cur | {key: best}, confirm, min_gain)
            log.append({"pass": p, "key": key, "tried_ms": tried, "best": best, "confirm_cur": ta,
                        "confirm_best": tb, "ratio": ratio, "taken": taken})
            if taken:
                cur[key] = best
                changed = True
        if not changed:
            break
    return cur, log


def confirmed_faster(time_fn: Callable[[dict[str, str]], float], cur: dict[str, str], alt: dict[str, str],
                     confirm: int = 4, min_gain: float = 0.005) -> tuple[bool, float, list[float], list[float]]:
    """Time `cur` and `alt` alternately `confirm` times each: (alt's median below 1 - min_gain of cur's, the
    median ratio alt / cur, cur's times, alt's times). Single timings of a step drift by about 1%."""
    ta, tb = [], []
    for _ in range(confirm):
        ta.append(time_fn(cur))
        tb.append(time_fn(alt))
    ratio = statistics.median(tb) / statistics.median(ta)
    return ratio < 1 - min_gain, ratio, ta, tb


def adopt(pm: PolicyMap, choices: dict[str, str], m: int) -> list[str]:
    """Write the changed `choices` at bucket m into pm (their profiled us kept where timed; a trigger variant
    keeps its tile's, which the profile timed under the rule's trigger); the keys changed."""
    changed = []
    for key, cand in choices.items():
        e = pm.lookup(key, m)
        if e is not None and same_candidate(cand, candidate_name(e.strategy, e.config)):
            continue
        s, cfg = parse_candidate(cand)
        timed = pm.timings.get(key, {}).get(str(m), {})
        us = timed.get(cand)
        if us is None and cfg is not None and cfg.trigger >= 0:  # a trigger variant: its tile's profiled time
            us = timed.get(candidate_name(s, dataclasses.replace(cfg, trigger=-1)))
        pm.set(key, m, Choice(s, cfg, us))
        changed.append(key)
    return changed
