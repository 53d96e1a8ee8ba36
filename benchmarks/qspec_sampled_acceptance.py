"""Sampled QSPEC's two cycles on a real model: the step-by-step one (drafts drawn and Leviathan's rule run on
the host, row by row) and the chained one (both on the device, all rows at once, `QSpecPolicy.accept_rows`).
They follow the same rule from different draws, so their acceptance rates must agree up to sampling noise;
the exact distribution is tested on a tiny model (tests/test_qspec_sampling.py), this checks real weights.

    PYTHONPATH=. python benchmarks/qspec_sampled_acceptance.py            # SmolLM2-135M (shipped GGUF), CPU
    PYTHONPATH=. python benchmarks/qspec_sampled_acceptance.py --model PATH --device cuda
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF folder, checkpoint or .gguf (default: the shipped SmolLM2)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--requests", type=int, default=32, help="requests (the 8 chat prompts repeated, seeds 0..)")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--draft-mode", default="w4a8")
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--sampling", default='{"temperature": 0.7, "top_p": 0.9}', metavar="JSON")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()

    from gearshift.decode.qspec import QSpecPolicy
    from gearshift.decode.sampling import SamplingParams
    from gearshift.engine.engine import Engine, Request
    from gearshift.model.loader import load_model

    lm = load_model(args.model, device=args.device, progress=False)
    texts = [p["text"] for p in json.loads((Path(__file__).parents[1] / "gearshift/data/prompts.json")
                                          .read_text())["prompts"][:8]]
    prompts = [lm.tokenizer.encode(texts[i % len(texts)]) for i in range(args.requests)]
    sampling = json.loads(args.sampling)
    rows = []
    for chained in (False, True):
        eng = Engine(lm, max_batch=args.batch)
        pol = QSpecPolicy(lm.model, args.draft_mode, "w4a16", args.gamma, chained_drafts=chained)
        t0 = time.perf_counter()
        eng.generate([Request(p, SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True, seed=i, **sampling))
                      for i, p in enumerate(prompts)], pol)
        st = eng.last_stats
        rows.append({"cycle": "chained (device)" if chained else "step-by-step (host)",
                     "acceptance_rate": st["acceptance_rate"], "mean_accepted_length": st["mean_accepted_length"],
                     "drafted": pol.counters["drafted"], "wall_s": round(time.perf_counter() - t0, 2)})
        print(json.dumps(rows[-1]), flush=True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    doc = {"device": name, "model": str(lm.source), "draft_mode": args.draft_mode, "gamma": args.gamma,
           "sampling": sampling, "requests": args.requests, "new_tokens": args.new_tokens, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"qspec_sampled_acceptance_{name.replace(' ', '_')}.json"
    path.write_text(json.dumps(doc, indent=1))
    a, b = (r["acceptance_rate"] for r in rows)
    n = min(r["drafted"] for r in rows)
    print(f"acceptance host {a:.4f}, device {b:.4f} (difference {b - a:+.4f}; one binomial standard error at "
          f"{n} drafts: {(a * (1 - a) / n) ** 0.5:.4f}) -> {path}")


if __name__ == "__main__":
    main()
