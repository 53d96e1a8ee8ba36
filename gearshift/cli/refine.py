"""`gearshift profile --refine`: re-choose a map's small-M picks on the model's graphed decode step.

The profile times each linear shape in a chain of its own. The engine's decode step interleaves the
linears with norms, attention and SwiGLU under PDL, and a tile's neighbours change its cost. For each
mode and batch size M, this takes each shape's fastest profiled candidates and searches them on the
decode step itself (`dispatch/step_search.py`). The step is captured as a CUDA graph of a
random-weight model at the model's shapes (`model/step_timer.py`): timing does not depend on weight
values. A change is kept only if it beats the current pick by more than `min_gain` in alternating
re-timings. With an incumbent map (the --seed map: what the engine runs without this profile), each
shape's incumbent pick joins its candidates, and the refined point must beat the incumbent's picks by
more than `min_gain` on the step, or the incumbent's are kept: a profile chooses on the linears alone,
and a seeded, refined profile once lost 2-4% of the decode step to its seed (stop 68, W4A4 on an H200).
"""

from __future__ import annotations

import statistics
from pathlib import Path


def model_config_path(model: str) -> str:
    """What `build_random_model` reads for --model: a preset name, the config.json of a directory, or for a
    GGUF file its config written to a temporary config.json."""
    p = Path(model)
    if p.is_file() and p.suffix.lower() == ".gguf":
        import json
        import tempfile

        from gearshift.model.gguf_loader import gguf_config

        out = Path(tempfile.mkdtemp(prefix="gearshift-refine-")) / "config.json"
        out.write_text(json.dumps(gguf_config(p)[0]))
        return str(out)
    return str(p / "config.json") if p.is_dir() else model


def mode_keys(pm, shapes, mode: str, group: int) -> list[str]:
    """The map's entry keys of the model's shapes in `mode` (each once: shapes can share an N x K)."""
    from gearshift.dispatch.policy import type_key

    return [k for k in dict.fromkeys(type_key(mode, group, n, kk) for _, n, kk in shapes) if k in pm.entries]


def shape_candidates(pm, keys, m: int, top: int, incumbent=None) -> tuple[dict[str, list[str]], dict[str, str]]:
    """({key: pm's pick, then its fastest other candidates, then the incumbent's pick where it is none of
    them}, {key: the incumbent's pick at m, as the engine looks it up}) for one batch size."""
    from gearshift.dispatch.policy import candidate_name
    from gearshift.dispatch.step_search import candidates, same_candidate

    cands = {key: candidates(pm, key, m, top) for key in keys}
    held = {}
    for key in keys:
        c = None if incumbent is None else incumbent.lookup(key, m)
        if c is None:
            continue
        held[key] = candidate_name(c.strategy, c.config)
        if not any(same_candidate(held[key], o) for o in cands[key]):
            cands[key].append(held[key])
    return cands, held


def refine_map(pm, model: str, shapes, modes, m_list, *, group: int, int4_prog: bool, int4_layout: str,
               top: int = 6, context: int = 512, min_gain: float = 0.005, incumbent=None, progress=None,
               say=print) -> list[dict]:
    """Search each (mode, M) of the map on the decode step; write the kept changes into pm.
    Returns one record per (mode, M): the step before and after, the keys changed, and with an
    incumbent map the step under its picks and whether they were kept."""
    from gearshift.dispatch import AdaptiveDispatcher
    from gearshift.dispatch.step_search import adopt, confirmed_faster, coordinate_descent, same_candidate, with_choices
    from gearshift.model.step_timer import DecodeStepTimer
    from gearshift.model.tiny import build_random_model

    weights = "int4-prog" if int4_prog else "int4"
    model_obj = build_random_model(model_config_path(model), weights=weights, group_size=group, device="cuda",
                                   int4_layout=int4_layout)
    records = []
    for mode in modes:
        keys = mode_keys(pm, shapes, mode, group)
        if not keys:
            say(f"refine {mode}: the map has none of this model's shapes; nothing to refine")
            continue
        for m in m_list:
            timer = DecodeStepTimer(model_obj, mode, batch=m, context=context)

            def step_ms(choices, m=m, timer=timer):
                return timer.ms(AdaptiveDispatcher(with_choices(pm, choices, m), autoload=False))

            cands, held = shape_candidates(pm, keys, m, top, incumbent)
            start = {k: c[0] for k, c in cands.items()}
            before = [step_ms(start) for _ in range(3)]
            cur, log = coordinate_descent(cands, step_ms, min_gain=min_gain,
                                          on_try=None if progress is None else lambda: progress.update(1))
            theirs = cur | held
            verdict = ""
            rec = {"mode": mode, "m": m}
            if any(not same_candidate(theirs[k], cur[k]) for k in held):
                try:  # the refined picks must beat the incumbent's, which are the base here
                    taken, ratio, ta, _ = confirmed_faster(step_ms, theirs, cur, min_gain=min_gain)
                except Exception as e:  # noqa: BLE001 - an incumbent tile this store cannot run
                    log.append({"incumbent": theirs, "error": f"{type(e).__name__}: {e}"[:200]})
                else:
                    rec.update(ms_incumbent=statistics.median(ta), kept_incumbent=not taken)
                    verdict = (f"; {incumbent.device}'s picks {rec['ms_incumbent']:.3f} ms"
                               + (", kept: the refined ones were not faster" if not taken
                                  else f", the refined ones {ratio:.3f}x that"))
                    if not taken:
                        cur = theirs
            after = [step_ms(cur) for _ in range(3)] if cur != start else before
            changed = adopt(pm, cur, m)
            rec.update(ms_before=statistics.median(before), ms_after=statistics.median(after), changed=changed,
                       errors=[e for e in log if "error" in e])
            records.append(rec)
            say(f"refine {mode} M={m}: decode step {rec['ms_before']:.3f} -> {rec['ms_after']:.3f} ms"
                + (f" ({', '.join(changed)} changed)" if changed else " (picks kept)") + verdict)
    return records


def refine_points(pm, shapes, modes, m_list, group: int, top: int, incumbent=None) -> int:
    """How many alternative candidates the search will try once per (mode, M) (for a progress bar)."""
    total = 0
    for mode in modes:
        keys = mode_keys(pm, shapes, mode, group)
        for m in m_list:
            cands, _ = shape_candidates(pm, keys, m, top, incumbent)
            total += sum(max(len(c) - 1, 0) for c in cands.values())
    return total
