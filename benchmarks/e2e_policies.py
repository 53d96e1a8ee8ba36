"""QSPEC and GEARBX through the engine with and without CUDA graphs (GPU).

Checks that graph replay gives the same tokens as eager execution for the multi-token verify
forwards of QSPEC and for GEARBX's store swaps, and reports tokens/s for each. QSPEC rows also
say whether the greedy tokens equal the setup's AR W4A16 tokens (DESIGN.md contract 1 at 8B
shapes on the GPU kernels: verify runs W4A16 at gamma + 1 tokens per sequence, AR at one, so the
two go through different tiles; a difference there is a floating-point tie or a bug, reported
with the first position where the sequences part).

    python benchmarks/e2e_policies.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--int4-prog", action="store_true",
                    help="int4 weights whose groups are int8 multiples of a row unit (--quantize int4-prog), so the "
                         "QSPEC drafts can run the int8 tensor-core kernel w4a8_progressive")
    ap.add_argument("--setups", default="int4,dense",
                    help="which model setups to run: int4 (AR W4A16 and the QSPEC drafts), dense (AR bf16, GEARBX)")
    ap.add_argument("--graph-max-rows", type=int, default=None, metavar="ROWS",
                    help="Transformer.graph_max_rows for the graphed rows: prefills of up to ROWS rows replay graphs "
                         "once their shapes recur; 0 runs them eagerly (as before stop 48). Default: the model's")
    ap.add_argument("--repeats", type=int, default=1,
                    help="timed generations per row (graphed rows): the one of median wall time is reported")
    ap.add_argument("--graphs-only", action="store_true",
                    help="skip the eager runs (each policy's tokens are then compared with AR's graphed ones)")
    ap.add_argument("--prompt-tokens", type=int, default=32,
                    help="random prompt length per sequence (longer prompts make every step's attention dearer)")
    ap.add_argument("--policies", default=None,
                    help="comma-separated row names to run (e.g. 'ar w4a16,qspec w4a8->w4a16 g3'); default: all")
    ap.add_argument("--sampling", default=None, metavar="JSON",
                    help="SamplingParams fields for every request, e.g. '{\"temperature\": 0.7, \"top_p\": 0.9}' "
                         "(request i seeded with i; default: greedy). Sampled QSPEC rows are then checked for the "
                         "same tokens between eager and graphed runs, not against AR's")
    ap.add_argument("--tag", default="", help="suffix of the results file")
    args = ap.parse_args()
    sampling = json.loads(args.sampling) if args.sampling else {}

    from gearshift.decode.autoregressive import AutoregressivePolicy
    from gearshift.decode.gearbox import GearboxPolicy
    from gearshift.decode.qspec import QSpecPolicy
    from gearshift.decode.sampling import SamplingParams
    from gearshift.engine.engine import Engine, Request
    from gearshift.model.config import ModelConfig
    from gearshift.model.loader import LoadedModel
    from gearshift.model.tiny import build_random_model, preset_config

    cfg = ModelConfig.from_hf_dict(preset_config(args.preset))
    rows = []
    setups = {
        "int4": [("ar w4a16", lambda m, n: AutoregressivePolicy(m, "w4a16")),
                 # the loop before stop 48: each step's tokens read back before the next step is launched
                 ("ar w4a16 step-by-step", lambda m, n: AutoregressivePolicy(m, "w4a16", pipelined=False)),
                 ("qspec w4a8->w4a16 g3", lambda m, n: QSpecPolicy(m, "w4a8", "w4a16", gamma=3)),
                 # the draft loop before stop 48: each draft read back before the next draft step
                 ("qspec w4a8->w4a16 g3 step-by-step", lambda m, n: QSpecPolicy(m, "w4a8", "w4a16", gamma=3,
                                                                                 chained_drafts=False)),
                 # the cycle before stop 51: the next cycle's drafts launched only after the read back
                 ("qspec w4a8->w4a16 g3 no-ahead", lambda m, n: QSpecPolicy(m, "w4a8", "w4a16", gamma=3,
                                                                             cycle_ahead=False)),
                 ("qspec w4a4->w4a16 g3", lambda m, n: QSpecPolicy(m, "w4a4", "w4a16", gamma=3))],
        "dense": [("ar w16a16", lambda m, n: AutoregressivePolicy(m, "w16a16")),
                  ("gearbox forced low", lambda m, n: GearboxPolicy(m, prompt_texts=["x"] * n, gears="low")),
                  ("gearbox forced mid", lambda m, n: GearboxPolicy(m, prompt_texts=["x"] * n, gears="mid"))],
    }
    unknown = set(args.setups.split(",")) - set(setups)
    if unknown:
        raise SystemExit(f"--setups: unknown {sorted(unknown)}; choose from {sorted(setups)}")
    setups = {k: v for k, v in setups.items() if k in args.setups.split(",")}
    if args.policies is not None:
        wanted = args.policies.split(",")
        names = sorted(name for pols in setups.values() for name, _ in pols)
        unknown = set(wanted) - set(names)
        if unknown:
            raise SystemExit(f"--policies: unknown {sorted(unknown)}; choose from {names}")
        setups = {k: [(n, f) for n, f in v if n in wanted] for k, v in setups.items()}
    for weights, policies in setups.items():
        torch.cuda.empty_cache()
        model = build_random_model(args.preset, weights="int4-prog" if weights == "int4" and args.int4_prog
                                   else weights, device="cuda")
        loaded = LoadedModel(model, None, cfg, args.preset)
        for b in [int(x) for x in args.batches.split(",")]:
            gen = torch.Generator().manual_seed(b)
            prompts = [torch.randint(0, cfg.vocab_size, (args.prompt_tokens,), generator=gen).tolist()
                       for _ in range(b)]
            ar_tokens = None
            for name, make in policies:
                res = {}
                for graphs in ((True,) if args.graphs_only else (False, True)):
                    model.use_cuda_graphs = graphs
                    if args.graph_max_rows is not None:
                        model.graph_max_rows = args.graph_max_rows
                    try:
                        # graphed: two warm-ups (the first compiles and sees the prefill's shapes, the second
                        # captures its graph), then timed; eager: one
                        warm = 2 if graphs else 1
                        timed = []
                        for i in range(warm + (args.repeats if graphs else 1)):
                            eng = Engine(loaded, max_batch=b)
                            reqs = [Request(p, SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True,
                                                              **({"seed": j, **sampling} if sampling else {})))
                                    for j, p in enumerate(prompts)]
                            pol = make(model, b)
                            out = eng.generate(reqs, pol)
                            if hasattr(pol, "close"):
                                pol.close()
                            if i >= warm:
                                timed.append(([r.token_ids for r in out], eng.last_stats))
                    except Exception as e:
                        print(f"FAILED {name} b={b} graphs={graphs}: {type(e).__name__}: {e}", flush=True)
                        continue
                    if any(t[0] != timed[0][0] for t in timed):
                        print(f"DIFFERENT TOKENS between repeats: {name} b={b} graphs={graphs}", flush=True)
                    timed.sort(key=lambda t: t[1]["wall_s"])
                    res[graphs] = timed[len(timed) // 2]
                same = len(res) == 2 and res[False][0] == res[True][0] if not args.graphs_only else None
                vs_ar = None
                ref = False if not args.graphs_only else True
                if name.startswith("ar ") and ref in res:
                    ar_tokens = res[ref][0]
                elif name.startswith("qspec") and ar_tokens is not None and ref in res and not sampling:
                    vs_ar = _first_difference(res[ref][0], ar_tokens)
                for graphs, (_, st) in res.items():
                    keep = {k: st[k] for k in ("tokens_per_s", "wall_s", "acceptance_rate", "mean_accepted_length",
                                               "draft_s", "verify_s", "prefill_s", "decode_s", "gear_counts", "shifts")
                            if k in st}
                    rows.append({"policy": name, "batch": b, "cuda_graphs": graphs, "same_tokens_as_eager": same,
                                 **({} if vs_ar is None else {"same_tokens_as_ar": vs_ar == "same",
                                                              "ar_difference": vs_ar}), **keep})
                    print(json.dumps(rows[-1]), flush=True)
        model.use_cuda_graphs = False
        del model, loaded
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "preset": args.preset,
           "new_tokens": args.new_tokens, "prompt_tokens": args.prompt_tokens, "int4_prog": args.int4_prog,
           "graph_max_rows": args.graph_max_rows, "sampling": sampling,
           "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = ("_int4prog" if args.int4_prog else "") + (f"_{args.tag}" if args.tag else "")
    (out / f"e2e_policies_{doc['device'].replace(' ', '_')}{tag}.json").write_text(json.dumps(doc, indent=1))
    print(f"\n{'policy':36} {'batch':>5} {'graphs':>6} {'tok/s':>9} same  vs AR")
    for r in rows:
        print(f"{r['policy']:36} {r['batch']:5d} {str(r['cuda_graphs']):>6} {r['tokens_per_s']:9.1f} "
              f"{str(r['same_tokens_as_eager']):5} {r.get('ar_difference', '')}")


def _first_difference(got: list[list[int]], ar: list[list[int]]) -> str:
    """"same", or where the first sequence that differs parts from AR (sequence i, token j)."""
    for i, (a, b) in enumerate(zip(got, ar)):
        if a != b:
            j = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return f"sequence {i} differs from token {j}"
    return "same" if len(got) == len(ar) else "different batch sizes"


if __name__ == "__main__":
    main()
