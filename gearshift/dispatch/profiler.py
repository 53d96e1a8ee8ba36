"""Offline profiler (ADAngel section 4.4): time every strategy and tile config on every GEMM
type of a model over the M buckets, keep the fastest as the policy map.

GEMM types are the model's unique (N, K) per weight format and mode: a handful per model, so an
exhaustive sweep is cheap. Each candidate is timed as CUDA-graph replays of calls rotating over
enough weight copies that the working set exceeds L2 (a single copy would time the cache), after
warm-up, median of several replays. Every timing is kept in the JSON so ablations (a static
strategy alone, ADAngel-R, the map without one strategy) are recomputed from one profile.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Callable, Collection, Iterable

import torch

from gearshift.dispatch.policy import (M_BUCKETS, Choice, PolicyMap, candidate_name, gpu_traits, nearest_shape_keys,
                                      parse_candidate, parse_type_key, triton_version, type_key)
from gearshift.dispatch.strategies import STRATEGIES, group_of, mode_key, rule_strategies, strategies_for, tiles_serve
from gearshift.kernels.switches import x_tiles_on
from gearshift.kernels.x_tiles import to_x_tiles
from gearshift.kernels.reference import linear_reference
from gearshift.quant.activations import ActQuantSpec
from gearshift.quant.base import DenseWeight, WeightFormat
from gearshift.quant.int4 import Int4Weight, blocks16_fits
from gearshift.quant.int8 import Int8Weight
from gearshift.quant.modes import MODES

#: (name, N, K) of the linear layers of one transformer block, and how many blocks
PRESETS: dict[str, dict] = {
    "llama3-8b": {"layers": 32, "shapes": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096),
                                           ("down", 4096, 14336)]},
}


def shapes_from_config(cfg: dict) -> list[tuple[str, int, int]]:
    """The block's fused linear shapes from a HF config.json (Llama/Mistral/Qwen family)."""
    h = int(cfg["hidden_size"])
    nh = int(cfg["num_attention_heads"])
    nkv = int(cfg.get("num_key_value_heads", nh))
    hd = int(cfg.get("head_dim") or h // nh)
    inter = int(cfg["intermediate_size"])
    return [("qkv", (nh + 2 * nkv) * hd, h), ("o", h, nh * hd), ("gate_up", 2 * inter, h), ("down", h, inter)]


def model_shapes(model: str) -> tuple[list[tuple[str, int, int]], int]:
    """Preset name or a model directory holding config.json -> (shapes, number of layers)."""
    if model in PRESETS:
        p = PRESETS[model]
        return list(p["shapes"]), int(p["layers"])
    cfg_path = Path(model) / "config.json" if Path(model).is_dir() else Path(model)
    cfg = json.loads(cfg_path.read_text())
    cfg = cfg.get("text_config", cfg)
    return shapes_from_config(cfg), int(cfg.get("num_hidden_layers", 1))


def random_store(fmt: str, n: int, k: int, group: int, device, dtype=torch.bfloat16,
                 layout: str = "rows") -> WeightFormat:
    """A random store of realistic value ranges (timing only; never zeros); int4 in `layout`
    where the shape fits it (`Int4Weight.to_layout`), with bf16-valued scales and mins (what the
    loader's `quantize_int4` writes); "int4p": int4 with row units
    (`quantize_int4_progressive`'s form)."""
    if fmt in ("int4", "int4p"):
        g = k if group <= 0 else group
        q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device)
        units = None
        if fmt == "int4p":  # groups that are exact int8 multiples of a per-row power of two
            units = torch.exp2(torch.randint(-13, -10, (n,), device=device).float())
            t = torch.randint(1, 16, (n, k // g), device=device).float()
            z = torch.randint(7, 9, (n, k // g), device=device).float()
            s, mn = (t * units[:, None]).half(), (-t * z * units[:, None]).half()
        else:
            s = torch.rand(n, k // g, device=device) * 0.02 + 0.005
            mn = -8 * s + torch.randn_like(s) * 0.001
            # bf16 values, as the loader's `quantize_int4` writes them
            s, mn = s.to(torch.bfloat16).half(), mn.to(torch.bfloat16).half()
        st = Int4Weight(q, s, mn, g, row_units=units)
        return st.to_layout(layout) if blocks16_fits(n, k) else st
    if fmt == "int8":
        q = torch.randint(-127, 128, (n, k), dtype=torch.int8, device=device)
        return Int8Weight(q, torch.rand(n, device=device) * 1e-3 + 1e-4)
    return DenseWeight((torch.randn(n, k, device=device) * 0.02).to(dtype))


def copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device-to-device copy, counting read + write (the floor's denominator)."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    a.random_(0, 255)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1))
    ts.sort()
    del a, b
    return 2 * (1 << 30) / (ts[len(ts) // 2] / 1000)


#: tokens from which `profile` times a candidate only after it ran alone for SUSTAIN_S seconds. W4A16 steps
#: of the Llama-3-8B linears run back to back draw 670-700 W at every M; from 64 tokens they hold the H100
#: at its 700 W cap with clocks at 1.3-1.9 GHz instead of 1.98 (stop 47,
#: `benchmarks/results/power_cap_stop47.md`). There, candidates timed in short bursts summed to 0.87-0.96
#: of such a step and sustained ones to 0.98-1.02; at 1-16 tokens both were within 1.3% of it.
SUSTAIN_FROM_M = 64
SUSTAIN_S = 0.3


def time_us(calls: list[Callable[[], object]], rounds: int | None = None, reps: int = 5,
            sustain_s: float = 0.0) -> float:
    """Median microseconds per call: CUDA-graph replays of `calls` (one per weight copy). With
    `sustain_s`, the replays first run back to back for that many seconds, so the timed ones see the
    clocks this work settles at under the GPU's power cap, not a cool GPU's boost clocks."""
    for f in calls:
        f()
    torch.cuda.synchronize()
    if rounds is None:
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        t0.record()
        for f in calls:
            f()
        t1.record()
        torch.cuda.synchronize()
        per = t0.elapsed_time(t1) / len(calls)  # ms, includes launch gaps: only to size the graph
        rounds = max(1, min(8, int(2.0 / max(per * len(calls), 1e-3))))
    g = torch.cuda.CUDAGraph()
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for f in calls:
                f()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            for _ in range(rounds):
                for f in calls:
                    f()
        runner = g.replay
    except Exception:  # not capturable: plain launches (launch overhead included)
        def runner():
            for _ in range(rounds):
                for f in calls:
                    f()
    runner()
    torch.cuda.synchronize()
    if sustain_s > 0:
        until = time.perf_counter() + sustain_s
        while time.perf_counter() < until:
            for _ in range(4):  # a few replays queued per check, so the GPU never idles between them
                runner()
            torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        runner()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1))
    del g
    return statistics.median(ts) * 1000.0 / (rounds * len(calls))


def time_configs(configs, supported: Callable[[object], bool], run: Callable[[object, object], object],
                 stores: list, on_error: Callable[[str], None] | None = None) -> dict[str, float | None]:
    """Microseconds per call of run(store, cfg) for each supported tile config (`time_us` over the
    weight copies `stores`), keyed by cfg.key(); None where it failed to compile or launch (then
    `on_error` gets a line, and the sweep goes on). For the kernel benchmarks' tile sweeps."""
    res: dict[str, float | None] = {}
    for cfg in configs:
        if not supported(cfg):
            continue
        try:
            res[cfg.key()] = time_us([lambda s=s, c=cfg: run(s, c) for s in stores])
        except Exception as e:  # a config that fails to compile/launch is skipped
            res[cfg.key()] = None
            if on_error:
                on_error(f"{cfg.key()}: {type(e).__name__}: {str(e)[:200]}")
    return res


def fastest(times: dict[str, float | None]) -> str | None:
    ok = {k: v for k, v in times.items() if v is not None}
    return min(ok, key=ok.get) if ok else None


def n_copies(store: WeightFormat, l2_bytes: int = 50 << 20) -> int:
    return max(2, min(16, math.ceil(3 * l2_bytes / max(store.nbytes(), 1))))


MODE_FORMATS = {"w4a16": "int4", "w4a8": "int4", "w4a8fp8": "int4", "w4a4": "int4", "w8a16": "int8",
                "w8a8": "int8", "w16a16": "dense"}


#: largest relative error against `linear_reference` a candidate may show and still be timed (the
#: kernels' measured worst: 3e-3, W4A4 3.6e-2 from the quantizer's rounding; docs/kernels.md)
PROFILE_TOLERANCE = {"w4a4": 6e-2}
DEFAULT_TOLERANCE = 1e-2


def profile(shapes: Iterable[tuple[str, int, int]], modes: Iterable[str], m_list=M_BUCKETS, group: int = 128,
            device_name: str | None = None, progress=None, policy: PolicyMap | None = None,
            strategies: list[str] | None = None, dtype=torch.bfloat16, log=None,
            int4_layout: str = "blocks16", int4_progressive: bool = False, timer=time_us,
            device: str = "cuda", seed: PolicyMap | None = None, top: int = 3, new_tiles: bool = False,
            done: Collection[str] = (), on_point: Callable[[PolicyMap, str], None] | None = None,
            sustain_s: float = SUSTAIN_S, sustain_from_m: int = SUSTAIN_FROM_M) -> PolicyMap:
    """Sweep (shape, mode, M, strategy, config); return the policy map, or `policy` extended (its
    other points kept; at a point timed again, the fastest over old and new timings). Int4 weights
    are timed in `int4_layout`, the engine's layout on GPU (`model.loader.use_int4_layout`);
    with `int4_progressive` as stores with row units, which every int4 kernel runs and
    `w4a8_progressive` needs (plain stores then run the fastest other timed candidate).
    Each candidate's output is first compared with the torch reference: one that is wrong (or
    NaN) is logged and never timed, so a fast wrong kernel cannot enter the map. `done`: ids
    (`point_id`) of points an interrupted run already timed into `policy`, skipped here;
    `on_point(map, id)` runs after each point, so a caller can save the work as it goes (a full sweep
    takes minutes to hours). From `sustain_from_m` tokens each candidate is timed after `sustain_s`
    seconds of running alone (`time_us`), at the clocks a whole step of that size runs at.
    timer / device: for tests (the CPU runs the Triton interpreter; timings there mean nothing)."""
    dev = torch.device(device)
    device_name = device_name or torch.cuda.get_device_name()
    pm = policy or PolicyMap(device_name, M_BUCKETS, meta={"dtype": str(dtype).replace("torch.", "")})
    pm.meta["int4_layout"] = int4_layout
    if int4_progressive:
        pm.meta["int4_row_units"] = True
    if dev.type == "cuda":
        pm.meta.update(gpu_traits(dev.index))
        pm.meta["triton"] = triton_version()  # tiles compile differently under another release
        pm.meta["torch"] = torch.__version__
    if seed is not None:
        pm.meta["seeded_from"] = {"device": seed.device, "top": top}
    for _, n, k in shapes:
        for mode_name in modes:
            fmt = MODE_FORMATS[mode_name]
            act: ActQuantSpec | None = MODES[mode_name].act
            g = group if fmt == "int4" else 0
            sfmt = "int4p" if fmt == "int4" and int4_progressive else fmt
            stores = [random_store(sfmt, n, k, g, dev, dtype, int4_layout)]
            key = type_key(mode_key(stores[0], act), group_of(stores[0]), n, k)
            todo = [m for m in m_list if point_id(key, m) not in done]
            if progress is not None and len(todo) < len(m_list):
                progress.update(len(m_list) - len(todo))
            if not todo:
                continue
            stores += [random_store(sfmt, n, k, g, dev, dtype, int4_layout) for _ in range(n_copies(stores[0]) - 1)]
            tol = PROFILE_TOLERANCE.get(mode_name, DEFAULT_TOLERANCE)
            for m in todo:
                x = torch.randn(m, k, device=dev, dtype=dtype)
                # where the engine's producers hand a fragment tile its inputs in that kernel's layout (W4A16,
                # `switches.x_tiles_on`: `AdaptiveDispatcher.x_tiles_for`), the tile is timed on them
                xt = (to_x_tiles(x) if x_tiles_on(m) and act is None and k % 128 == 0
                      and isinstance(stores[0], Int4Weight) else None)
                hot = sustain_s > 0 and m >= sustain_from_m
                ref = None  # computed at the first candidate: a bucket no strategy serves needs none
                cands: dict[str, float | None] = {}
                sweep = [(strat, cfg) for strat in strategies_for(mode_key(stores[0], act))
                         if strategies is None or strat.name in strategies
                         for cfg in strat.configs(m) if strat.supports(stores[0], act, cfg)]
                if seed is not None:
                    sweep = seeded_sweep(sweep, seed, key, m, top, new_tiles)
                if hasattr(progress, "set_postfix_str"):  # a tqdm bar: what this point costs (1 to ~350 candidates)
                    progress.set_postfix_str(f"{key} M={m}: {len(sweep)} candidates")
                for strat, cfg in sweep:
                    name = candidate_name(strat.name, cfg)
                    try:
                        if ref is None:
                            ref = linear_reference(x.float(), stores[0], act)
                        if xt is not None and strat.run_tiles is not None and tiles_serve(stores[0], cfg):
                            run = (lambda s, st=strat, c=cfg: st.run_tiles(xt, m, s, c))
                        else:
                            run = (lambda s, st=strat, c=cfg: st.run(x, s, act, c))
                        err = relative_error(run(stores[0]), ref)
                        if not err <= tol:  # NaN fails too
                            cands[name] = None
                            if log:
                                log(f"{key} M={m} {name}: wrong result (relative error {err:.2e} > {tol:.0e}), "
                                    "not timed")
                            continue
                        calls = [lambda s=s, r=run: r(s) for s in stores]
                        cands[name] = timer(calls, sustain_s=sustain_s) if hot else timer(calls)
                    except Exception as e:  # a config that fails to compile/launch is skipped
                        cands[name] = None
                        if log:
                            log(f"{key} M={m} {name}: {type(e).__name__}: {str(e)[:200]}")
                # extending a map (policy=...): this run's timings join the point's earlier ones (newer
                # win) and the entry is the fastest of all, so a narrowed re-profile cannot drop others;
                # unless the earlier ones were timed in the other regime (burst against sustained), which
                # differ by 5-15% at these sizes and do not compare
                point = pm.timings.setdefault(key, {}).setdefault(str(m), {})
                if cands:
                    mark_regime(pm.meta, point_id(key, m), point, hot)
                point.update(cands)
                ok = [(us, c) for c, us in point.items() if us is not None]
                if ok and m in pm.buckets:
                    us, c = min(ok)
                    name, cfg = parse_candidate(c)
                    pm.set(key, m, Choice(name, cfg, us))
                if on_point is not None:
                    on_point(pm, point_id(key, m))
                if progress is not None:
                    progress.update(1)
            del stores
            torch.cuda.empty_cache()
    return pm


def mark_regime(meta: dict, pid: str, point: dict, hot: bool) -> None:
    """Record in a map's meta["sustained_points"] whether point `pid` is now timed sustained (`hot`),
    before new timings join `point` (its candidate timings); if the earlier ones were of the other
    regime, it loses them first."""
    sustained = meta.get("sustained_points", [])
    if point and (pid in sustained) != hot:
        point.clear()
    if hot and pid not in sustained:
        sustained.append(pid)
    elif not hot and pid in sustained:
        sustained.remove(pid)
    if sustained:
        meta["sustained_points"] = sustained
    else:
        meta.pop("sustained_points", None)


def point_id(key: str, m: int) -> str:
    """How a checkpoint names one profiled point (a GEMM type at one M)."""
    return f"{key} M={m}"


def seed_point(seed: PolicyMap, key: str, m: int) -> dict | None:
    """The seed's timings (candidate name -> us or None) at (key, m), or where it never timed that
    shape, at the nearest shape of the same mode and group that it timed at m; None if neither."""
    cands = seed.timings.get(key, {}).get(str(m))
    if not cands:
        for near in nearest_shape_keys(seed.timings, *parse_type_key(key)):
            cands = seed.timings[near].get(str(m))
            if cands:
                break
    return cands or None


def seeded_candidates(seed: PolicyMap, key: str, m: int, top: int) -> set | None:
    """The (strategy, config) pairs worth timing at (key, m) on a GPU like the one `seed` was
    profiled on: its `top` fastest there, and the fastest of each other strategy it timed (so
    stores that cannot run the winners, and the ablations, still find theirs). A shape the seed never
    timed is ranked by the seed's nearest shape of the same mode and group that it timed at m (another
    model's shapes: minutes, not a full sweep). None where the seed has nothing of the mode at m:
    then everything is timed."""
    cands = seed_point(seed, key, m)
    if not cands:
        return None
    ranked = sorted(((us, c) for c, us in cands.items() if us is not None), key=lambda t: t[0])
    out: set = set()
    seen: set = set()
    for i, (_, c) in enumerate(ranked):
        name, cfg = parse_candidate(c)
        if i < top or name not in seen:
            out.add((name, cfg))
        seen.add(name)
    return out


def seeded_sweep(sweep: list, seed: PolicyMap, key: str, m: int, top: int, new_tiles: bool = False) -> list:
    """The part of `sweep` ([(strategy, config)]) that a seeded profile times at (key, m): the seed's
    picks there (`seeded_candidates`). A strategy none of whose picks the sweep has (the seed never
    timed it at m, or its tiles changed since) takes its `top` fastest tiles at the nearest M bucket
    where the seed timed tiles of it that this sweep has; only without any is it timed in full, not
    left out (a full sweep of one strategy at one point is ~150 candidates: stop 51 saw a seeded
    profile spend 5 minutes on 4 of 64 points that way). With new_tiles, every tile the seed's point
    never timed is timed too (tiles added since; the shipped maps keep only some timings per point,
    so this is most of a sweep)."""
    allowed = seeded_candidates(seed, key, m, top)
    if allowed is None:
        return sweep
    seeded = {st.name for st, cfg in sweep if (st.name, cfg) in allowed}
    for name in sorted({st.name for st, _ in sweep} - seeded):
        near = nearest_bucket_picks(seed, key, m, name, {cfg for st, cfg in sweep if st.name == name}, top)
        if near:
            allowed |= {(name, cfg) for cfg in near}
            seeded.add(name)
    known = set(seed_point(seed, key, m) or ()) if new_tiles else None
    return [(st, cfg) for st, cfg in sweep if st.name not in seeded or (st.name, cfg) in allowed
            or (known is not None and candidate_name(st.name, cfg) not in known)]


def nearest_bucket_picks(seed: PolicyMap, key: str, m: int, name: str, cfgs: set, top: int) -> list:
    """Strategy `name`'s `top` fastest tiles among `cfgs` at the M bucket nearest m (in log M) where
    the seed timed any of them at this shape (or its nearest timed shape); [] where it never did."""
    buckets = {int(b) for k in [key, *nearest_shape_keys(seed.timings, *parse_type_key(key))]
               for b in seed.timings.get(k, {})} - {m}
    for b in sorted(buckets, key=lambda b: (abs(math.log2(b / m)), b)):
        ranked = sorted((us, i, cfg) for i, (c, us) in enumerate((seed_point(seed, key, b) or {}).items())
                        if us is not None for s, cfg in [parse_candidate(c)] if s == name and cfg in cfgs)
        if ranked:
            return [cfg for _, _, cfg in ranked[:top]]
    return []


def unseen_pairs(seed: PolicyMap, shapes, modes, group: int) -> tuple[list[str], int]:
    """The (mode, shape) type keys a seeded profile will sweep in full because the seed timed no shape
    of that mode and group, and how many keys there are (other shapes of a timed mode are ranked by
    the nearest timed shape: `seeded_candidates`)."""
    keys = [type_key(mode, group if mode.startswith("w4") else 0, n, k) for _, n, k in shapes for mode in modes]
    timed = {t[:2] for t in map(parse_type_key, seed.timings) if t is not None}
    return [key for key in keys if parse_type_key(key)[:2] not in timed], len(keys)


def relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """||y - ref|| / ||ref|| in fp32 (NaN if y holds NaN or inf)."""
    y = y.float()
    if not torch.isfinite(y).all():
        return float("nan")
    return ((y - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def best_of(pm: PolicyMap, key: str, m: int, allowed: Callable[[str], bool]) -> float | None:
    cands = pm.timings.get(key, {}).get(str(m), {})
    vals = [us for c, us in cands.items() if us is not None and allowed(parse_candidate(c)[0])]
    return min(vals) if vals else None


def ablations(pm: PolicyMap, shapes, layers: int, mode: str, group: int = 128, m_list=None) -> dict:
    """Per M: summed us per model step for the map, each static strategy, ADAngel-R, map minus one."""
    fmt_group = group if MODE_FORMATS[mode] == "int4" else 0
    keys = [type_key(mode, fmt_group, n, k) for _, n, k in shapes]
    m_list = m_list or sorted({int(m) for key in keys for m in pm.timings.get(key, {})})
    names = sorted({parse_candidate(c)[0] for key in keys for per in pm.timings.get(key, {}).values() for c in per})
    out: dict = {}
    for m in m_list:
        row: dict[str, float | None] = {}

        def total(allowed):
            vals = [best_of(pm, key, m, allowed) for key in keys]
            return None if any(v is None for v in vals) else layers * sum(vals)

        row["map"] = total(lambda s: True)
        for s in names:
            row[f"only:{s}"] = total(lambda t, s=s: t == s)
            row[f"without:{s}"] = total(lambda t, s=s: t != s)
        rule = rule_strategies(mode, m)
        row["adangel_r"] = None if not rule else total(lambda t, r=tuple(rule): t in r)
        out[str(m)] = {k: (None if v is None else round(v, 2)) for k, v in row.items()}
    return out


__all__ = ["PRESETS", "profile", "ablations", "model_shapes", "random_store", "time_us", "STRATEGIES"]
