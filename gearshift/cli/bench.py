"""`gearshift bench`: end-to-end generation speed of decode policies on the user's own model.

Each (policy, batch size) runs the real engine on seeded random prompts, greedy and past EOS, so
every run generates the same number of tokens: once to compile kernels and capture CUDA graphs,
then `--repeat` timed runs (the median is reported). Speed-ups are against `ar` in the same run,
and QSPEC's greedy tokens are compared with `ar`'s, which they must equal when it verifies in ar's mode
(up to floating-point ties: where they differ, the first differing position is scored in the verify mode
and called a tie or not, in the warning and as `first_divergence` in --json).
GEARBX runs on the weights as loaded (it builds its own gears), the other policies on one shared load.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from gearshift.cli.common import HelpFormatter, add_model_args
from gearshift.cli.generate import add_decode_args, load_for_policies, policy_module
from gearshift.errors import GearshiftError


def _ints(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return out


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure generation speed of decode policies on a model",
                       description=__doc__.split("\n\n", 1)[1], formatter_class=HelpFormatter,
                       epilog="example:\n  gearshift bench --model PATH --policy ar,qspec --draft-mode w4a8 "
                              "--batch-size 1,4,16 --json bench.json")
    add_model_args(p)
    p.add_argument("--batch-size", type=_ints, default=[1, 4], metavar="N[,N...]",
                   help="concurrent sequences, one engine run each (default: 1,4)")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per sequence (default: 128)")
    p.add_argument("--gen-len", type=int, default=128, help="tokens generated per sequence (default: 128)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per row after two warm-ups; the median "
                                                          "is reported (default: 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts (default: 0)")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the rows and the device as JSON")
    add_decode_args(p, policies=True)
    p.set_defaults(handler=run)


def _prompts(vocab: int, batch: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g).tolist()


def time_policy(engine, policy, prompts: list[list[int]], gen_len: int, repeat: int) -> tuple[dict, list]:
    """The median of `repeat` timed runs after two warm-ups, and the tokens of the median run."""
    from gearshift.decode.sampling import SamplingParams
    from gearshift.engine.engine import Request

    def once():
        reqs = [Request(list(ids), SamplingParams(max_new_tokens=gen_len, ignore_eos=True)) for ids in prompts]
        results = engine.generate(reqs, policy)
        return dict(engine.last_stats), [r.token_ids for r in results]

    once()  # compiles kernels, captures the decode steps' CUDA graphs, fills the allocator
    once()  # captures the prefills' graphs (a prefill shape is captured when it is seen again)
    runs = [once() for _ in range(repeat)]
    stats, tokens = sorted(runs, key=lambda r: r[0]["wall_s"])[(len(runs) - 1) // 2]
    n = len(prompts)
    decode_s = stats["wall_s"] - stats["mean_time_to_first_token_s"]
    after_first = stats["generated_tokens"] - n
    row = {"policy": stats["policy"], "mode": stats["mode"], "batch": n, "prompt_len": len(prompts[0]),
           "gen_len": gen_len, "wall_s": stats["wall_s"], "wall_s_runs": [r[0]["wall_s"] for r in runs],
           "ttft_ms": round(1000 * stats["mean_time_to_first_token_s"], 2),
           "tokens_per_s": stats["tokens_per_s"],
           "decode_tokens_per_s": round(after_first / decode_s, 2) if decode_s > 0 and after_first > 0 else None,
           "ms_per_token_per_seq": round(1000 * decode_s / (after_first / n), 3) if after_first > 0 else None}
    for k in ("acceptance_rate", "mean_accepted_length", "gear_counts"):
        if k in stats:
            row[k] = stats[k]
    return row, tokens


def run(args) -> int:
    from gearshift.engine.engine import Engine
    from gearshift.quant.modes import get_mode

    for name, value in (("--prompt-len", args.prompt_len), ("--gen-len", args.gen_len), ("--repeat", args.repeat)):
        if value < 1:
            raise GearshiftError(f"{name} must be >= 1")
    mods = {name: policy_module(name) for name in args.policy}
    for mod in mods.values():
        for m in mod.modes(args):
            get_mode(m)  # fail fast on an unknown mode, before loading anything
    # GEARBX builds its gears from the weights as loaded ("native"); the other policies share one load
    groups: dict[bool, list[str]] = {}
    for name, mod in mods.items():
        groups.setdefault("native" in mod.modes(args), []).append(name)
    from tqdm import tqdm

    bar = tqdm(total=len(args.batch_size) * len(mods), desc="bench", file=sys.stderr, disable=None, leave=False)
    rows = []
    ar_tokens: dict[int, list] = {}
    ar_rate: dict[int, float] = {}
    divergences: dict = {}  # batch -> engine.divergence.Divergence of QSPEC against ar
    meta: dict = {}
    for names in groups.values():
        loaded = load_for_policies(args, [mods[n] for n in names])
        cfg = loaded.config
        if args.prompt_len + args.gen_len > cfg.max_position_embeddings:
            raise GearshiftError(f"--prompt-len + --gen-len is {args.prompt_len + args.gen_len}; the model's "
                                 f"context holds {cfg.max_position_embeddings}")
        meta.setdefault("model", str(loaded.source))
        meta.setdefault("device", torch.cuda.get_device_name() if loaded.model.device.type == "cuda" else "cpu")
        meta.setdefault("weights", {})["+".join(names)] = loaded.weight_summary()
        if "policy_map" in loaded.info:
            meta["policy_map"] = loaded.info["policy_map"]
        for name in names:
            policy = mods[name].build(args, loaded)
            for batch in args.batch_size:
                engine = Engine(loaded, max_batch=batch)
                prompts = _prompts(cfg.vocab_size, batch, args.prompt_len, args.seed)
                row, tokens = time_policy(engine, policy, prompts, args.gen_len, args.repeat)
                row["policy"] = name
                if name == "ar":
                    ar_tokens[batch], ar_rate[batch] = tokens, row["tokens_per_s"]
                elif name == "qspec" and args.verify_mode == args.mode and tokens != ar_tokens.get(batch, tokens):
                    from gearshift.engine.divergence import first_divergence

                    div = first_divergence(loaded.model, prompts, ar_tokens[batch], tokens, args.verify_mode)
                    if div is not None:  # where they part, and whether it is a floating-point tie
                        row["first_divergence"] = div.to_dict()
                        divergences[batch] = div
                rows.append((row, tokens))
                bar.update()
        del loaded, policy
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    bar.close()
    rows.sort(key=lambda rt: (rt[0]["batch"], args.policy.index(rt[0]["policy"])))
    for row, tokens in rows:  # against ar of the same batch, whichever order they ran in
        b = row["batch"]
        if b in ar_tokens and row["policy"] != "ar":
            if row["policy"] == "qspec" and args.verify_mode == args.mode:  # its output must be ar's
                row["same_tokens_as_ar"] = tokens == ar_tokens[b]
            row["speedup_vs_ar"] = round(row["tokens_per_s"] / ar_rate[b], 3) if ar_rate[b] else None
    rows = [r for r, _ in rows]
    _print_table(rows)
    if args.json:
        out = {**meta, "torch": torch.__version__, "prompt_len": args.prompt_len, "gen_len": args.gen_len,
               "rows": rows}
        try:
            with open(args.json, "w") as fh:
                json.dump(out, fh, indent=1)
        except OSError as e:
            raise GearshiftError(f"cannot write --json: {e.strerror}: {args.json}") from None
    bad = [r for r in rows if r["policy"] == "qspec" and r.get("same_tokens_as_ar") is False]
    for r in bad:
        div = divergences.get(r["batch"])
        why = div.describe() if div is not None else "not scored (QSPEC ran before ar, or only the lengths differ)"
        print(f"gearshift: warning: greedy QSPEC tokens differ from ar's at batch {r['batch']}: {why}",
              file=sys.stderr)
    return 0


def _print_table(rows: list[dict]) -> None:
    cols = [("policy", "policy"), ("mode", "mode"), ("batch", "batch"), ("ttft_ms", "TTFT ms"),
            ("ms_per_token_per_seq", "ms/token"), ("decode_tokens_per_s", "decode tok/s"),
            ("tokens_per_s", "tok/s"), ("speedup_vs_ar", "vs ar"), ("same_tokens_as_ar", "same tokens"),
            ("acceptance_rate", "accept")]
    cols = [(k, h) for k, h in cols if any(k in r for r in rows)]

    def cell(r, k):
        v = r.get(k, "")
        if isinstance(v, float):
            return f"{v:.3f}" if k in ("speedup_vs_ar", "acceptance_rate") else f"{v:.1f}"
        return "yes" if v is True else "NO" if v is False else str(v)

    table = [[h for _, h in cols]] + [[cell(r, k) for k, _ in cols] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(cols))]
    for line in table:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths)))
    print(f"median of each row's timed runs; {rows[0]['prompt_len']} prompt tokens and {rows[0]['gen_len']} "
          "generated per sequence, greedy past EOS", file=sys.stderr)
