"""A/B two settings of the engine's kernel switches end to end, in one process (GPU).

`e2e.py` runs one setting per process, and separate processes on the lent H100 differ by a few
percent from run to run. Here one random-weight model (8B shapes) and one engine decode the same
prompts under setting A and setting B alternately (A, B, A, B, ...), CUDA graphs on (the graphs are
keyed by the switches, so each side replays its own), and the medians of the graphed ms per decode
step are compared. Greedy tokens are reported per side (settings that change the bits, such as
the attention kernel, may change them).

    python benchmarks/e2e_ab.py --set-b decode_attention=0 --modes w4a8 --batches 1,16 --prompt-len 512 \\
        --int4-prog --out benchmarks/results
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e import model_for  # noqa: E402
from gearshift.kernels import switches  # noqa: E402


def parse_switches(spec: str) -> dict:
    out = {}
    for item in filter(None, spec.split(",")):
        name, _, value = item.partition("=")
        # numbers stay numbers (swiglu_codes_min_rows=64); set_switches casts to each switch's type
        # words stay words where the switch is one (small_trigger=wait); else false / true
        try:
            out[name] = int(value) if value.lstrip("-").isdigit() else float(value)
        except ValueError:
            out[name] = value if isinstance(dict(switches.state()).get(name), str) else value not in ("false", "False", "")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set-a", default="", help="switches of side A, NAME=0|1[,...] (gearshift/kernels/switches.py)")
    ap.add_argument("--set-b", action="append", default=None,
                    help="the same for side B; repeat it for sides C, D, ... (each timed against A)")
    ap.add_argument("--map", action="append", default=None, metavar="SIDE=PATH",
                    help="run side SIDE (a, b, c, ...) on the policy map at PATH instead of the installed one "
                    "(graphs are keyed by the dispatcher, so each side replays its own kernels)")
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--modes", default="w4a8")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--int4-prog", action="store_true", help="int4 weights with row units (--quantize int4-prog)")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    from gearshift.decode.autoregressive import AutoregressivePolicy
    from gearshift.decode.sampling import SamplingParams
    from gearshift.dispatch import AdaptiveDispatcher, get_dispatcher, set_dispatcher
    from gearshift.dispatch.policy import load_map_file
    from gearshift.engine.engine import Engine, Request
    from gearshift.kernels import switches
    from gearshift.model.config import ModelConfig
    from gearshift.model.loader import LoadedModel
    from gearshift.model.tiny import preset_config

    if len(args.set_b or []) > 7:
        raise SystemExit("at most 7 --set-b sides (B..H)")
    sides = {"a": parse_switches(args.set_a)}
    for i, spec in enumerate(args.set_b or [""]):
        sides["bcdefgh"[i]] = parse_switches(spec)
    maps = dict(item.split("=", 1) for item in (args.map or []))
    unknown = set(maps) - set(sides)
    if unknown:
        raise SystemExit(f"--map names sides {sorted(unknown)}; the sides are {sorted(sides)}")
    default = dict(switches.state())
    for s in sides.values():
        switches.set_switches(**s)  # unknown names fail here, before any model is built
        switches.set_switches(**default)
    cfg = ModelConfig.from_hf_dict(preset_config(args.preset))
    rows = []
    models = {}
    for mode in args.modes.split(","):
        model = model_for(models, args.preset, mode, args.int4_prog)
        model.use_cuda_graphs = True
        loaded = LoadedModel(model, None, cfg, args.preset)
        for b in (int(x) for x in args.batches.split(",")):
            gen = torch.Generator().manual_seed(b)
            prompts = [torch.randint(0, cfg.vocab_size, (args.prompt_len,), generator=gen).tolist() for _ in range(b)]
            eng = Engine(loaded, max_batch=b)
            times = {name: [] for name in sides}
            tokens = {}
            installed = get_dispatcher()
            dispatchers = {n: AdaptiveDispatcher(load_map_file(p), autoload=False) for n, p in maps.items()}
            for r in range(args.rounds + 1):  # round 0 captures the graphs and is not counted
                for name, sw in sides.items():
                    switches.set_switches(**(default | sw))
                    set_dispatcher(dispatchers.get(name, installed))
                    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
                    out = eng.generate([Request(p, params) for p in prompts], AutoregressivePolicy(model, mode))
                    st = eng.last_stats
                    if r:
                        times[name].append(st["decode_s"] / st["forwards"] * 1e3)
                    tokens[name] = hashlib.sha1(repr([o.token_ids for o in out]).encode()).hexdigest()[:12]
            switches.set_switches(**default)
            set_dispatcher(installed)
            ms = {name: statistics.median(t) for name, t in times.items()}
            row = {"mode": mode, "batch": b, "ms_a": ms["a"], "ms_b": ms["b"], "runs": times, "tokens_sha1": tokens,
                   "ms": ms, "over_a": {name: v / ms["a"] for name, v in ms.items()}}
            row["b_over_a"] = row["ms_b"] / row["ms_a"]
            rows.append(row)
            print(f"{mode:7} B={b:3}: A {ms['a']:.3f} ms  " + "  ".join(
                f"{n.upper()} {v:.3f} ({v / ms['a']:.3f})" for n, v in ms.items() if n != "a")
                + "  tokens " + " ".join(f"{n.upper()} {h}" for n, h in tokens.items()), flush=True)
    dev = torch.cuda.get_device_name()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = args.tag if not args.tag or args.tag.startswith("_") else "_" + args.tag
    (out / f"e2e_ab_{dev.replace(' ', '_')}{tag}.json").write_text(json.dumps(
        {"device": dev, "preset": args.preset, "set_a": args.set_a, "set_b": (args.set_b or [""])[0],
         "sides": {n: ",".join(f"{k}={v}" for k, v in sw.items()) for n, sw in sides.items()}, "maps": maps,
         "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "int4_prog": args.int4_prog,
         "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
