"""The decode loops' host-side changes A/B, interleaved (GPU): AR one step ahead vs step by step,
QSPEC with drafts chained on the device vs read back one by one, and GEARBX one step ahead vs step by
step (on a dense bf16 model, its gears resident on the device so a shift is a pointer swap).

Whole generations through the engine on a random-weight model at real shapes (int4-prog stores,
CUDA graphs, prefill graphs), 32-token prompts; the sides alternate round by round, so drift in the
GPU's clocks or the host's speed hits both alike. Reports the median tok/s of each side and the
per-round ratios, and whether the sides' tokens are equal.

    PYTHONPATH=. python benchmarks/loop_ab.py --batches 1,4,16 --rounds 9 --tag NAME
    PYTHONPATH=. python benchmarks/loop_ab.py --policies gearbox --batches 1,4,16 --rounds 7 --tag NAME
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _ab(pairs, loaded, model, args) -> list[dict]:
    """Each pair's sides alternated over args.rounds whole generations per batch; one row per (pair, batch)."""
    from gearshift.decode.sampling import SamplingParams
    from gearshift.engine.engine import Engine, Request

    rows = []
    for b in (int(x) for x in args.batches.split(",")):
        gen = torch.Generator().manual_seed(b)
        prompts = [torch.randint(0, model.config.vocab_size, (32,), generator=gen).tolist() for _ in range(b)]

        def run(make):
            eng = Engine(loaded, max_batch=b)
            pol = make()
            res = eng.generate([Request(p, SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True))
                                for p in prompts], pol)
            if hasattr(pol, "close"):
                pol.close()
            return [r.token_ids for r in res], eng.last_stats

        for name, (old, new) in pairs.items():
            for _ in range(2):  # compile, see and capture every shape
                run(old), run(new)
            tps = {"before": [], "after": []}
            toks = {}
            for _ in range(args.rounds):
                for side, make in (("before", old), ("after", new)):
                    toks[side], st = run(make)
                    tps[side].append(st["tokens_per_s"])
            ratios = [a / b_ for a, b_ in zip(tps["after"], tps["before"])]
            rows.append({"policy": name, "batch": b, "before_tok_s": statistics.median(tps["before"]),
                         "after_tok_s": statistics.median(tps["after"]), "ratio_median": statistics.median(ratios),
                         "ratio_min": min(ratios), "ratio_max": max(ratios), "same_tokens": toks["before"] == toks["after"],
                         "rounds": args.rounds})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--policies", default="ar,qspec",
                    help="comma list of ar, qspec (int4-prog model), gearbox (dense bf16 model, built after the "
                    "int4 one is freed)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("loop_ab.py times whole generations on a CUDA GPU")

    from e2e import model_for
    from kernel_bench import tag_suffix, write_json

    from gearshift.decode.autoregressive import AutoregressivePolicy
    from gearshift.decode.gearbox import GearboxPolicy
    from gearshift.decode.precision import PrecisionManager
    from gearshift.decode.qspec import QSpecPolicy
    from gearshift.dispatch.policy import device_slug
    from gearshift.model.loader import LoadedModel

    wanted = args.policies.split(",")
    unknown = set(wanted) - {"ar", "qspec", "gearbox"}
    if unknown:
        raise SystemExit(f"--policies: unknown {sorted(unknown)} (choose from ar, qspec, gearbox)")
    models: dict = {}
    rows = []

    def gearbox_pairs(model):
        # one manager for every run, its gears resident: a generation's shifts then cost pointer swaps,
        # not host copies, and the first run builds the gears (quantization) outside the timed rounds
        manager = PrecisionManager(model, "attention", offload_originals=False, cache_device="device")

        def make(pipelined, **kw):
            return lambda: GearboxPolicy(model, prompt_texts=["x"] * 64, manager=manager, pipelined=pipelined, **kw)
        pairs = {f"gearbox forced {g}": (make(False, gears=g), make(True, gears=g)) for g in ("low", "mid")}
        # every row starts high and wants low after the minimum gear duration (thresholds far above a
        # random model's entropies): one shift per generation, the step launched ahead of it dropped
        shifting = dict(initial_gear="high", calibrate=False,
                        monitor_kwargs=dict(theta_low=30.0, theta_high=40.0, catastrophic_fraction=2.0))
        pairs["gearbox high->low"] = (make(False, **shifting), make(True, **shifting))
        return pairs

    for kind in ("int4", "dense"):
        if kind == "int4" and not {"ar", "qspec"} & set(wanted) or kind == "dense" and "gearbox" not in wanted:
            continue
        model = model_for(models, args.preset, "w4a16" if kind == "int4" else "w16a16", True)
        model.use_cuda_graphs = True
        loaded = LoadedModel(model, None, model.config, args.preset)
        pairs = {}
        if kind == "int4" and "ar" in wanted:
            pairs["ar w4a16"] = (lambda: AutoregressivePolicy(model, "w4a16", pipelined=False),
                                 lambda: AutoregressivePolicy(model, "w4a16", pipelined=True))
        if kind == "int4" and "qspec" in wanted:
            pairs["qspec w4a8->w4a16 g3"] = (lambda: QSpecPolicy(model, "w4a8", "w4a16", 3, chained_drafts=False),
                                             lambda: QSpecPolicy(model, "w4a8", "w4a16", 3, chained_drafts=True))
        if kind == "dense":
            pairs.update(gearbox_pairs(model))
        rows += _ab(pairs, loaded, model, args)
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "preset": args.preset,
           "new_tokens": args.new_tokens, "rows": rows}
    write_json(args.out, f"loop_ab_{device_slug(doc['device'])}{tag_suffix(args.tag)}.json", doc)
    print(f"\n{'policy':22} {'b':>3} {'before':>8} {'after':>8} {'ratio':>6} {'min':>6} {'max':>6} same")
    for r in rows:
        print(f"{r['policy']:22} {r['batch']:3d} {r['before_tok_s']:8.1f} {r['after_tok_s']:8.1f} "
              f"{r['ratio_median']:6.3f} {r['ratio_min']:6.3f} {r['ratio_max']:6.3f} {r['same_tokens']}")


if __name__ == "__main__":
    main()
