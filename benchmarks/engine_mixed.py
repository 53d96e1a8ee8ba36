"""The dispatched engine against single static strategies on a mixed prefill + decode workload (GPU).

Issue 6 asks that the engine with the policy map beat every single static strategy on a mixed
workload. `kernel_bench.py` answers it on sums of linear-only steps over M; this runs the engine itself:
requests of mixed prompt lengths under continuous batching (prefills of tens to thousands of rows,
decode steps at batch 1..max-batch), CUDA graphs on, each dispatcher with its own graphs:
  map        the shipped policy map (what the engine loads)
  rules      no map: the rule-based choice by M (the paper's ADAngel-R)
  <strategy> `AdaptiveDispatcher(static=...)`: one strategy for every linear at every M (only those
             that serve every M; per point the map's best tile of that strategy)
  map, batch-wide prefill   the map, with a joining sequence prefilled over every slot of the batch
             (`DecodePolicy.compact_prefill = False`, the engine before stop 48)
Dispatchers alternate round by round after two warm-up runs each. Reports median wall time, tok/s
and the per-round ratio to the map, and whether each side's tokens equal the map's.

    PYTHONPATH=. python benchmarks/engine_mixed.py --modes w4a16,w4a8 --rounds 3 --tag NAME
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

STATICS = {"w4a16": ["w4a16_tc", "dequant_cublas"], "w4a8": ["w4a8_pad", "w4a8_split", "dequant_cublas"]}
PROMPTS = [37, 120, 250, 500, 900, 64, 300, 700, 150, 1000, 80, 400]


def serves_everything(model, d, mode: str) -> bool:
    """Whether the static dispatcher `d` runs its own strategy on every quantized linear at decode
    and prefill sizes (not the torch reference)."""
    from gearshift.dispatch.strategies import STRATEGIES

    for name, lin in model.linear_layers():
        if name == "lm_head":
            continue
        act = lin._act(mode)
        for m in (1, 4, 16, 64, 1024, 4096):
            c = d.choose(lin.store, act, m)
            if c is None or c.strategy != d.static or not STRATEGIES[c.strategy].supports(lin.store, act, c.config):
                return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--modes", default="w4a16,w4a8")
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--stagger", action="store_true",
                    help="vary max_new_tokens per request (0.5x, 0.83x, 1.17x, 1.5x of --new-tokens in turn), so "
                         "sequences finish at different steps and new ones join a running batch one by one")
    ap.add_argument("--prompts", default=",".join(map(str, PROMPTS)), help="prompt lengths, one request each")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sides", default="", help="comma list of the sides to run (default: all)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("engine_mixed.py runs the engine on a CUDA GPU")

    from e2e import model_for
    from kernel_bench import tag_suffix, write_json

    from gearshift.decode.autoregressive import AutoregressivePolicy
    from gearshift.decode.base import DecodePolicy
    from gearshift.decode.sampling import SamplingParams
    from gearshift.dispatch import AdaptiveDispatcher, install_policy, set_dispatcher
    from gearshift.dispatch.policy import describe, device_slug
    from gearshift.engine.engine import Engine, Request
    from gearshift.model.cuda_graphs import GraphRunner
    from gearshift.model.loader import LoadedModel

    lengths = [int(x) for x in args.prompts.split(",")]
    budgets = [round(args.new_tokens * (0.5 + (i % 4) / 3)) if args.stagger else args.new_tokens
               for i in range(len(lengths))]
    gen = torch.Generator().manual_seed(0)
    model = None
    installed = install_policy()  # the device's map, loaded now (not on first use)
    shipped = installed.policy
    rows = []
    for mode in args.modes.split(","):
        model = model_for({}, args.preset, mode, True)  # int4-prog: W4A8 runs its int8 kernels
        model.use_cuda_graphs = True
        model._graphs = GraphRunner(max_graphs=512)  # every dispatcher keeps its graphs through the rounds
        loaded = LoadedModel(model, None, model.config, args.preset)
        prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in lengths]
        sides = {"map": (installed, True), "map, batch-wide prefill": (installed, False),
                 "rules": (AdaptiveDispatcher(None, autoload=False), True)}
        for name in STATICS[mode]:
            d = AdaptiveDispatcher(shipped, autoload=False, static=name)
            if serves_everything(model, d, mode):
                sides[name] = (d, True)
            else:  # it would run the torch reference somewhere: not a fair side, and far too slow
                print(f"{mode} {name}: does not serve every linear at every M here; left out", flush=True)

        if args.sides:
            sides = {k: v for k, v in sides.items() if k in args.sides.split(",") or k == "map"}

        def run(side):
            d, compact = side
            set_dispatcher(d)
            DecodePolicy.compact_prefill = compact
            eng = Engine(loaded, max_batch=args.max_batch)
            res = eng.generate([Request(p, SamplingParams(max_new_tokens=n, ignore_eos=True))
                                for p, n in zip(prompts, budgets)], AutoregressivePolicy(model, mode))
            return [r.token_ids for r in res], eng.last_stats

        tokens, walls, stats = {}, {k: [] for k in sides}, {}
        try:
            for name, d in sides.items():
                for _ in range(2):  # compile, see every prefill shape, capture
                    tokens[name], _ = run(d)
                print(f"{mode} {name}: warm", flush=True)
            for _ in range(args.rounds):
                for name, d in sides.items():
                    _, st = run(d)
                    walls[name].append(st["wall_s"])
                    stats[name] = st
        finally:
            set_dispatcher(installed)
            DecodePolicy.compact_prefill = True
        for name in sides:
            ratios = [w / m for w, m in zip(walls[name], walls["map"])]
            st = stats[name]
            rows.append({"mode": mode, "dispatcher": name, "wall_s": statistics.median(walls[name]),
                         "tokens_per_s": st["generated_tokens"] / statistics.median(walls[name]),
                         "prefill_s": st.get("prefill_s"), "decode_s": st.get("decode_s"),
                         "wall_over_map": statistics.median(ratios), "ratio_min": min(ratios),
                         "ratio_max": max(ratios), "same_tokens_as_map": tokens[name] == tokens["map"],
                         "walls": walls[name]})
            print(json.dumps(rows[-1]), flush=True)
        model.use_cuda_graphs = False
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "preset": args.preset,
           "map": describe(shipped), "prompt_lengths": lengths, "new_tokens_per_request": budgets, "max_batch": args.max_batch,
           "new_tokens": args.new_tokens, "rounds": args.rounds, "rows": rows}
    write_json(args.out, f"engine_mixed_{device_slug(doc['device'])}{tag_suffix(args.tag)}.json", doc)
    print(f"\n{'mode':6} {'dispatcher':24} {'wall s':>7} {'tok/s':>8} {'prefill':>8} {'decode':>7} {'x map':>6} same")
    for r in rows:
        print(f"{r['mode']:6} {r['dispatcher']:24} {r['wall_s']:7.3f} {r['tokens_per_s']:8.1f} "
              f"{r['prefill_s'] or 0:8.3f} {r['decode_s'] or 0:7.3f} {r['wall_over_map']:6.3f} "
              f"{r['same_tokens_as_map']}")


if __name__ == "__main__":
    main()
