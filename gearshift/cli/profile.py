"""`gearshift profile`: build the ADAngel policy map for a model on this GPU.

Enumerates the model's unique linear shapes (from its config.json, a preset, or --shapes), times
every strategy and tile config over the M buckets, and writes the map to
~/.cache/gearshift/policy/<device>.json (or --out), where the engine finds it at model load. An
existing map of this GPU there is extended, not replaced. A GPU without a map of its own runs the
map of the nearest GPU of its architecture meanwhile; --seed auto times only what that map found
fastest, which takes minutes instead of a full sweep. A map of this GPU that lacks points (a run
of some M buckets or modes) runs that map's picks at them, so a short run changes its points only.

The work is saved after every point to <out>.partial (the engine never reads it): a run that is
interrupted (Ctrl-C, a time limit) is continued by the same command with --resume, which times
only the points still missing.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from gearshift.cli.common import HelpFormatter


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("profile", help="profile GEMM strategies on this GPU and write the policy map",
                              description=__doc__.split("\n", 2)[2].strip(),
                              formatter_class=HelpFormatter)
    p.add_argument("--model", default=None,
                   help="model directory (config.json; a gearshift checkpoint too), a .gguf file, or a preset: "
                        "llama3-8b")
    p.add_argument("--out", default=None,
                   help="policy JSON path (default: ~/.cache/gearshift/policy/<device>.json). A map of this GPU "
                        "already there (at the default path: else the one shipped for this GPU and Triton release) is "
                        "extended: its other shapes and modes are kept. The map records the Triton release it "
                        "was timed under; the engine prefers <device>.triton<major.minor>.json where one exists")
    p.add_argument("--replace", action="store_true", help="write a map of only what this run profiles")
    p.add_argument("--m", default=None, help="comma-separated M buckets (default: 1,2,4,...,4096)")
    p.add_argument("--modes", default="w4a16,w4a8,w4a8fp8,w4a4",
                   help="comma-separated precision modes (default: w4a16,w4a8,w4a8fp8,w4a4; w4a4 is QSPEC's "
                        "default draft mode)")
    p.add_argument("--group-size", type=int, default=None,
                   help="int4 group size of the stores (-1: per row). Default: the group the model's int4 weights "
                        "hold (32 for a GGUF of Q4_0 / Q4_1, a quantized checkpoint's own), else 128; the engine "
                        "looks a linear up by its store's group, so a map of another group does not serve it")
    p.add_argument("--int4-layout", default="blocks16", choices=("rows", "blocks16"),
                   help="int4 byte order to time (the engine loads int4 weights as blocks16 on GPU unless "
                        "told --int4-layout rows)")
    p.add_argument("--int4-prog", action="store_true",
                   help="time int4 stores whose groups are exact int8 multiples of a row unit (models quantized "
                        "with --quantize int4-prog): adds the int8 tensor-core W4A8/W4A4 kernel "
                        "w4a8_progressive; plain int4 models then run the fastest other kernel the map timed")
    p.add_argument("--shapes", default=None,
                   help="explicit NxK list, e.g. 6144x4096,4096x4096 (instead of, or overriding, --model)")
    p.add_argument("--strategies", default=None,
                   help="time only these strategies (comma-separated names, e.g. w4a16_mma,w4a8_mma), e.g. to "
                        "re-profile one kernel family for benchmarks/policy_merge.py; default: all")
    p.add_argument("--seed", default=None, metavar="MAP",
                   help="time only what a map profiled on a similar GPU found fastest: a policy JSON path, or "
                        "'auto' for the map the engine runs on this GPU now (its own, or the shipped map of the "
                        "same architecture). A strategy it has no pick of at a point takes its fastest tiles at "
                        "the nearest M the seed timed it at; points the seed never timed, and strategies it "
                        "never timed at all (new kernels, changed tiles), are swept in full. From the shipped "
                        "H100 map this times about 3600 of the 35000 candidates of all four modes")
    p.add_argument("--top", type=int, default=3,
                   help="with --seed: the seed's fastest this many candidates per point, plus the fastest of "
                        "each other strategy it timed (default: 3)")
    p.add_argument("--new-tiles", action="store_true",
                   help="with --seed: also time every tile the seed never timed at a point (tiles added since "
                        "it was made). The shipped maps keep only some timings per point, so from them this "
                        "times most tiles at 1..64 tokens (most of a full sweep); benchmarks/mma_ablations/"
                        "tile_seed.py times just the new variants of the seed's best tiles")
    p.add_argument("--refine", default=None, metavar="M[,M...]",
                   help="after profiling, re-choose the picks at these batch sizes (M buckets, e.g. 1,2,4,8,16) "
                        "on the model's graphed decode step: each shape's --refine-top fastest profiled tiles are "
                        "searched with the norms, attention and SwiGLU between the linears, and a change is kept "
                        "only if it is confirmed faster by 0.5%%. With --seed, the seed's pick of each shape is "
                        "searched too, and the seed's picks are kept unless the refined ones beat them on the "
                        "step by 0.5%%. Needs --model (a random-weight model of its "
                        "shapes is built on the GPU); about half a minute per (mode, M) once tiles are compiled")
    p.add_argument("--refine-only", action="store_true",
                   help="with --refine: skip the profile and refine the map already at --out (at the default "
                        "path: the one there, else the map shipped for this GPU and Triton release)")
    p.add_argument("--refine-top", type=int, default=6, help="with --refine: candidates per shape (default 6)")
    p.add_argument("--refine-context", type=int, default=512,
                   help="with --refine: cached tokens each sequence of the decode step attends to (default 512)")
    p.add_argument("--sustain", type=float, default=None, metavar="SECONDS",
                   help="from --sustain-from tokens, run each candidate alone this long before timing it, so it "
                        "is timed at the clocks it settles at under the GPU's power cap, not at a cool GPU's boost "
                        "clocks: an H100 running 8B-sized linears at 64-4096 tokens per step for seconds sits at "
                        "700 W and 1.3-1.9 GHz instead of 1.98, and short bursts timed such steps 3-13%% fast "
                        "(default 0.3 s per candidate; 0 turns it off; a point timed the other way before loses those "
                        "timings)")
    p.add_argument("--sustain-from", type=int, default=None, metavar="M",
                   help="the smallest M bucket that --sustain applies to (default: 64)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run of the same command from <out>.partial: the points it "
                        "saved are kept, not timed again")
    p.set_defaults(handler=run)
    return p


def seed_release_note(seed, top: int) -> str | None:
    """What to say when the seed map was timed under another Triton release: its ranking of tiles
    need not hold here (stop 38: under Triton 3.9, seeded from the 3.6 map, a top 8 found new
    one-token W4A16 winners and a top 30 still other four-token tiles)."""
    from gearshift.dispatch.policy import toolchain_note

    note = toolchain_note(seed)
    if note is None:
        return None
    return (f"the seed map was {note.split(':')[0]}: its ranking of tiles may not hold under this release, "
            f"so --top {top} may miss the fastest ones here (a larger --top, e.g. 30, times more of them)")


def extend_base(out, device: str, default_out: bool):
    """The map a profile run extends: the one at `out` if it is this GPU's; at the default path with
    nothing there yet, the map shipped for this GPU and the running Triton release (else the
    release-agnostic one), so profiling another model's shapes does not hide the shipped ones; else
    None (a fresh map)."""

    from gearshift.dispatch.policy import PolicyMap, bundled_dir, map_file_names
    from gearshift.errors import GearshiftError

    p = Path(out)
    if p.is_file():
        try:
            pm = PolicyMap.load(p)
        except (OSError, ValueError) as e:  # PolicyMap.load: any malformed file is one ValueError
            raise GearshiftError(f"{p} exists and is not a policy map ({e}); move it or pass --replace") from None
        if pm.device != device:
            raise GearshiftError(f"{p} holds the map of {pm.device}, not this {device}; choose another --out "
                                 "or pass --replace")
        pm.path = str(p)
        return pm
    for shipped in (bundled_dir() / n for n in map_file_names(device)):  # this Triton release's first
        if default_out and shipped.is_file():
            pm = PolicyMap.load(shipped)
            pm.path = str(shipped)
            return pm
    return None


def refine_buckets(args) -> list[int]:
    """The --refine batch sizes, checked before any GPU work (empty without --refine)."""
    from gearshift.dispatch.policy import M_BUCKETS
    from gearshift.errors import GearshiftError

    if args.refine_only and not args.refine:
        raise GearshiftError("--refine-only needs --refine M[,M...]: the batch sizes to refine")
    if not args.refine:
        return []
    if not args.model:
        raise GearshiftError("--refine times the model's decode step: give --model (a preset or a directory "
                             "with config.json), not only --shapes")
    if args.group_size <= 0:
        raise GearshiftError("--refine builds a group-wise int4 model: give a --group-size above 0")
    if args.refine_context < 1:
        raise GearshiftError(f"--refine-context must be at least 1 cached token, got {args.refine_context}")
    if args.refine_top < 2:
        raise GearshiftError(f"--refine-top must be at least 2 (the pick and one alternative), got {args.refine_top}")
    try:
        ms = [int(v) for v in args.refine.split(",") if v.strip()]
    except ValueError:
        raise GearshiftError(f"--refine takes batch sizes like 1,2,4,8,16, got {args.refine!r}") from None
    bad = [m for m in ms if m not in M_BUCKETS]
    if bad or not ms:
        raise GearshiftError(f"--refine batch sizes must be M buckets of the map ({', '.join(map(str, M_BUCKETS))}); "
                             f"got {args.refine!r}")
    return ms


def finish_refine(args, pm, shapes, modes, refine_m, out, incumbent=None) -> int:
    """Run the decode-step search on pm, record it in the map's meta and save it at out. incumbent: the
    --seed map, whose picks a refined point must beat on the step (`cli/refine.py`)."""
    from tqdm import tqdm

    from gearshift.cli.refine import refine_map, refine_points

    say = lambda line: tqdm.write(line, file=sys.stderr)  # noqa: E731 - keeps lines above the bar
    total = refine_points(pm, shapes, modes, refine_m, args.group_size, args.refine_top, incumbent)
    with tqdm(total=total, desc="refine on the decode step", unit="tile") as bar:
        recs = refine_map(pm, args.model, shapes, modes, refine_m, group=args.group_size, int4_prog=args.int4_prog,
                          int4_layout=args.int4_layout, top=args.refine_top, context=args.refine_context,
                          incumbent=incumbent, progress=bar, say=say)
    keep = ("mode", "m", "ms_before", "ms_after", "changed", "ms_incumbent", "kept_incumbent")
    run = {"model": str(args.model), "context": args.refine_context, "top": args.refine_top,
           "int4_prog": bool(args.int4_prog), "points": [{k: r[k] for k in keep if k in r} for r in recs]}
    if incumbent is not None:
        run["incumbent"] = incumbent.device
    pm.meta["refined"] = list(pm.meta.get("refined", [])) + [run]
    path = pm.save(out)
    print(f"policy map written to {path} (refined on the decode step at M = {', '.join(map(str, refine_m))})")
    return 0


def filled_note(path) -> str | None:
    """What the engine adds to the map at `path` when it loads it on this GPU: the points it takes from
    the maps of the same architecture (`policy.fill_missing`), said once a run has written a map of
    only some points. None where it takes none."""
    from gearshift.dispatch.policy import PolicyMap, fill_missing, filled_points, gpu_traits

    pm = fill_missing(PolicyMap.load(path), gpu_traits())
    filled = filled_points(pm)
    if filled is None:
        return None
    taken, devices = filled
    return (f"this map holds {pm.points() - taken} of the {pm.points()} points the engine runs from it here; it takes "
            f"the other {taken} from the map of {devices} (same architecture) when it loads")


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def partial_path(out) -> Path:
    """Where a run saves its work point by point: beside the map, under a name the engine never loads."""
    p = Path(out)
    return p.with_name(p.name + ".partial")


def run_signature(args, shapes, m_list, modes, fresh: bool | None) -> dict:
    """What must match for --resume to continue a saved run: everything that decides which points
    exist and how they are timed (`fresh`, whether the run started from no map, is only recorded)."""
    return {"model": args.model, "shapes": [list(s) for s in shapes], "modes": modes, "m": m_list,
            "group_size": args.group_size, "int4_layout": args.int4_layout, "int4_prog": bool(args.int4_prog),
            "strategies": args.strategies, "seed": args.seed, "top": args.top if args.seed else None,
            "new_tiles": bool(args.new_tiles), "sustain": [args.sustain, args.sustain_from],
            "replace": bool(args.replace), "fresh": fresh}


def resume_state(partial, signature: dict):
    """(the saved map, the ids of its finished points) of an interrupted run with this signature."""
    from gearshift.dispatch.policy import PolicyMap
    from gearshift.errors import GearshiftError

    if not partial.is_file():
        raise GearshiftError(f"nothing to resume: no interrupted profile at {partial} (run without --resume)")
    try:
        pm = PolicyMap.load(partial)
        saved = pm.meta["partial"]
        saved_sig, done = saved["run"], set(saved["done"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise GearshiftError(f"{partial} is not a saved profile run ({e}); delete it and start again") from None
    diff = sorted(k for k in set(signature) | set(saved_sig)
                  if k != "fresh" and signature.get(k) != saved_sig.get(k))
    if diff:
        was = "; ".join(f"{k}: saved {saved_sig.get(k)!r}, now {signature.get(k)!r}" for k in diff)
        raise GearshiftError(f"--resume needs the interrupted run's arguments ({partial}): {was}")
    return pm, done


def parse_lists(args) -> tuple[list[int] | None, list[str], list[tuple[str, int, int]] | None]:
    """--m, --modes and --shapes as (token counts or None for every bucket, modes, shapes or None),
    checked before anything needs the GPU: a typo gets a one-line error, not a traceback."""
    from gearshift.dispatch.profiler import MODE_FORMATS
    from gearshift.errors import GearshiftError

    m_list = None
    if args.m:
        m_list = []
        for v in args.m.split(","):
            if not v.strip().isdigit() or int(v) < 1:
                raise GearshiftError(f"--m: {v.strip()!r} is not a token count of at least 1 (e.g. --m 1,16,256)")
            m_list.append(int(v))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODE_FORMATS]
    if unknown or not modes:
        raise GearshiftError(f"--modes: unknown {unknown or args.modes!r}; profiled modes: {', '.join(MODE_FORMATS)}")
    shapes = None
    if args.shapes:
        shapes = []
        for i, item in enumerate(args.shapes.split(",")):
            parts = item.strip().lower().split("x")
            if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
                raise GearshiftError(f"--shapes: {item.strip()!r} is not NxK (out x in features, e.g. 4096x4096)")
            shapes.append((f"s{i}", int(parts[0]), int(parts[1])))
    return m_list, modes, shapes


def sustain_kwargs(args) -> dict:
    """--sustain / --sustain-from as `profile` keywords (unset: the profiler's defaults), checked up front."""
    from gearshift.errors import GearshiftError

    out = {}
    if args.sustain is not None:
        if not args.sustain >= 0:
            raise GearshiftError(f"--sustain must be 0 (off) or a number of seconds, got {args.sustain}")
        out["sustain_s"] = args.sustain
    if args.sustain_from is not None:
        if args.sustain_from < 1:
            raise GearshiftError(f"--sustain-from must be a token count of at least 1, got {args.sustain_from}")
        out["sustain_from_m"] = args.sustain_from
    return out


def read_target(model: str) -> tuple[list[tuple[str, int, int]], int, int | None]:
    """(linear shapes, layers, the group its int4 weights hold or None) of --model: a preset, an HF folder or
    gearshift checkpoint (config.json), or a GGUF file (its metadata; the weights are not read)."""
    import json

    from gearshift.dispatch.profiler import model_shapes, shapes_from_config

    p = Path(model)
    if p.is_file() and p.suffix.lower() == ".gguf":
        from gearshift.model.gguf_loader import gguf_config

        cfg, group = gguf_config(p)
        return shapes_from_config(cfg), int(cfg["num_hidden_layers"]), group
    shapes, layers = model_shapes(model)
    manifest = p / "gearshift.json" if p.is_dir() else None
    groups = []
    if manifest is not None and manifest.is_file():
        layers_meta = json.loads(manifest.read_text()).get("layers", {})
        groups = [int(v["meta"]["group_size"]) for v in layers_meta.values()
                  if v.get("format") == "int4g" and "group_size" in v.get("meta", {})]
    return shapes, layers, (max(set(groups), key=groups.count) if groups else None)


def run(args) -> int:
    import torch
    from tqdm import tqdm

    from gearshift.dispatch.policy import M_BUCKETS, cache_dir, device_slug
    from gearshift.dispatch.profiler import ablations, profile, unseen_pairs
    from gearshift.errors import GearshiftError

    if not args.model and not args.shapes:
        raise GearshiftError("say what to profile: --model (a model directory, a .gguf file or a preset such as "
                             "llama3-8b) or --shapes NxK,...")
    target = None
    if args.model:
        try:
            target = read_target(args.model)
        except (OSError, KeyError, ValueError) as e:
            raise GearshiftError(f"cannot read model shapes from {args.model!r}: {e}") from None
    if args.group_size is None:
        held = target[2] if target is not None else None
        args.group_size = held or 128
        if held:
            print(f"gearshift: timing int4 stores of group {held}, as {args.model} holds (--group-size overrides)",
                  file=sys.stderr)
    refine_m = refine_buckets(args)
    m_arg, modes, shape_arg = parse_lists(args)
    sustain = sustain_kwargs(args)
    strategies = None
    if args.strategies:
        from gearshift.dispatch.strategies import STRATEGIES

        strategies = [n.strip() for n in args.strategies.split(",") if n.strip()]
        unknown = sorted(set(strategies) - set(STRATEGIES))
        if unknown:
            raise GearshiftError(f"unknown strategies {unknown}; known: {', '.join(sorted(STRATEGIES))}")
        idle = [m for m in modes if not any(m in STRATEGIES[n].modes for n in strategies)]
        if idle:
            raise GearshiftError(f"no strategy in --strategies serves mode(s) {idle}; narrow --modes or add one")
    seed = None
    if args.new_tiles and not args.seed:
        raise GearshiftError("--new-tiles only narrows a seeded run (--seed MAP); without a seed every tile is timed")
    if args.seed:
        from gearshift.dispatch.policy import PolicyMap, load_policy_for_device

        if args.top < 1:
            raise GearshiftError(f"--top must be at least 1, got {args.top}")
        if args.seed != "auto":
            try:
                seed = PolicyMap.load(args.seed)
            except (OSError, ValueError) as e:  # load turns any malformed file into one ValueError
                raise GearshiftError(f"cannot read the seed map {args.seed!r}: {e}") from None
            if not seed.timings:
                raise GearshiftError(f"the seed map {args.seed!r} holds no candidate timings to rank")
    if not torch.cuda.is_available():
        raise GearshiftError("gearshift profile needs a CUDA GPU (the policy map is per device)")
    if shape_arg is not None:
        shapes = shape_arg
        layers = 1
    else:
        shapes, layers, _ = target
    if args.seed == "auto":
        seed = load_policy_for_device()
        if seed is None:
            raise GearshiftError("--seed auto: no policy map for this GPU or its architecture; "
                                 "give a map's path, or profile without --seed")
    m_list = m_arg if m_arg is not None else list(M_BUCKETS)
    device = torch.cuda.get_device_name()
    if seed is not None:
        unseen, total = unseen_pairs(seed, shapes, modes, args.group_size)
        if unseen:
            print(f"gearshift: the seed map ({seed.device}) never timed {len(unseen)} of the {total} "
                  f"(mode, shape) pairs, e.g. {unseen[0]}: those are swept in full", file=sys.stderr)
        release_note = seed_release_note(seed, args.top)
        if release_note:
            print(f"gearshift: {release_note}", file=sys.stderr)
    out = args.out or (cache_dir() / f"{device_slug(device)}.json")
    if args.refine_only:
        base = extend_base(out, device, default_out=args.out is None)
        if base is None:
            raise GearshiftError(f"--refine-only: no policy map of this GPU at {out} to refine; profile first")
        print(f"gearshift: refining the map at {getattr(base, 'path', out)}; writing it to {out}", file=sys.stderr)
        rc = finish_refine(args, base, shapes, modes, refine_m, out, incumbent=seed)
        note = filled_note(out)
        if note:
            print(f"gearshift: {note}", file=sys.stderr)
        return rc
    partial = partial_path(out)
    n_points = len(shapes) * len(modes) * len(m_list)
    done: set[str] = set()
    if args.resume:
        base, done = resume_state(partial, run_signature(args, shapes, m_list, modes, fresh=None))
        fresh = bool(base.meta["partial"]["run"].get("fresh"))
        print(f"gearshift: resuming the run saved at {partial}: {len(done)} of {n_points} points done", file=sys.stderr)
    else:
        base = None if args.replace else extend_base(out, device, default_out=args.out is None)
        fresh = base is None
        if base is not None:
            print(f"gearshift: extending the map at {getattr(base, 'path', out)} ({len(base.entries)} shape/mode "
                  "entries kept unless profiled again; --replace starts afresh)", file=sys.stderr)
        if partial.is_file():
            print(f"gearshift: an interrupted run was saved at {partial}; this run starts afresh and overwrites it "
                  "(--resume would have continued it)", file=sys.stderr)
    signature = run_signature(args, shapes, m_list, modes, fresh)

    def checkpoint(pm, point: str) -> None:
        done.add(point)
        pm.meta["partial"] = {"run": signature, "done": sorted(done), "of": n_points}
        pm.save(partial)

    skipped: list[str] = []
    on_term = signal.signal(signal.SIGTERM, _interrupted)  # `timeout`, a job scheduler: say where the work is
    try:
        with tqdm(total=n_points, desc=f"profile {device}", unit="point") as bar:
            pm = profile(shapes, modes, m_list, group=args.group_size, device_name=device, progress=bar,
                         int4_layout=args.int4_layout, int4_progressive=args.int4_prog, strategies=strategies,
                         log=skipped.append, seed=seed, top=args.top, new_tiles=args.new_tiles, policy=base,
                         done=frozenset(done), on_point=checkpoint, **sustain)
    except KeyboardInterrupt:
        where = f"saved at {partial}" if done else "nothing was saved"
        print(f"\ngearshift: interrupted after {len(done)} of {n_points} points ({where}); the same command with "
              "--resume continues it", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, on_term)
    pm.meta.pop("partial", None)
    if skipped:  # configs that did not compile / launch, or whose output missed the reference
        print(f"{len(skipped)} candidate(s) left out of the map:", file=sys.stderr)
        for line in skipped[:10]:
            print(f"  {line}", file=sys.stderr)
        if len(skipped) > 10:
            print(f"  ... and {len(skipped) - 10} more", file=sys.stderr)
    run = {"model": str(args.model or "--shapes"), "layers": layers, "shapes": shapes, "modes": modes, "m": m_list}
    if fresh:
        pm.meta.update({k: run[k] for k in ("model", "layers", "shapes")})
    else:
        pm.meta["extended"] = list(pm.meta.get("extended", [])) + [run]
    path = pm.save(out)
    partial.unlink(missing_ok=True)
    if refine_m:
        finish_refine(args, pm, shapes, modes, refine_m, out, incumbent=seed)
    for mode in modes:
        ab = ablations(pm, shapes, layers, mode, group=args.group_size)
        for m, row in ab.items():
            if row["map"] is not None:
                print(f"{mode} M={m}: map {row['map'] / 1000:.3f} ms/step"
                      + ("" if row.get("adangel_r") is None else f", ADAngel-R {row['adangel_r'] / 1000:.3f}"))
    print(f"policy map written to {path}")
    note = filled_note(path)
    if note:
        print(f"gearshift: {note}", file=sys.stderr)
    return 0
