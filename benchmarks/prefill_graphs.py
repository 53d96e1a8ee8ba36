"""Prefill forwards with and without CUDA graphs (GPU): what `Transformer.graph_max_rows` buys.

An eager forward of an 8B model is host-bound up to about a thousand tokens (30-60 ms of Python and
launches for ~320 kernels against 4-25 ms of GPU work). Steps of 17..graph_max_rows rows run padded to
a token bucket and replay a graph from the second time their shapes are seen. For each mode, batch and
prompt length this times, in one process, with CUDA-synchronized wall clocks (median of --reps):
  eager      graphs off: the unpadded eager forward (what every prefill ran before)
  first      graphs on, first sight: the padded forward, run eagerly
  capture    graphs on, second sight: one warm-up, the capture and a replay
  replay     graphs on, from the third sight: the replay alone
and checks that first, capture and replay give the same logits bit for bit. Then whole generations
through the engine (AR, batch 1, prompts of mixed lengths, each bucket seen several times), with
prefill graphs off (graph_max_rows = 0) and on: prefill time per request and tokens/s.

    PYTHONPATH=. python benchmarks/prefill_graphs.py --tag NAME
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def wall_ms(fn) -> float:
    """CUDA-synchronized wall time of fn(), ms."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def forwards(model, mode: str, batch: int, lengths: list[int], reps: int) -> list[dict]:
    from gearshift.model.cuda_graphs import GraphRunner, token_bucket

    rows = []
    cache = model.new_cache(batch, max(lengths) * 2 + 64)
    for t in lengths:
        if batch * token_bucket(t) > model.graph_max_rows:
            continue
        ids = torch.randint(0, model.config.vocab_size, (batch, t), device="cuda")

        def fwd():
            for b in range(batch):
                cache.reset(b)
            return model(ids, cache, [0] * batch, [t] * batch, mode=mode, logits="last")

        model.use_cuda_graphs = False
        fwd()
        eager = statistics.median(wall_ms(fwd) for _ in range(reps))
        ref = fwd()
        model.use_cuda_graphs = True
        model._graphs = GraphRunner()
        out = {}
        first = wall_ms(lambda: out.setdefault("first", fwd()))
        capture = wall_ms(lambda: out.setdefault("capture", fwd()))
        replay = statistics.median(wall_ms(fwd) for _ in range(reps))
        out["replay"] = fwd()
        model.use_cuda_graphs = False
        same = out["first"].equal(out["capture"]) and out["capture"].equal(out["replay"])
        rel = ((out["replay"] - ref).norm() / ref.norm()).item()
        rows.append({"mode": mode, "batch": batch, "tokens": t, "bucket": token_bucket(t), "eager_ms": eager,
                     "first_ms": first, "capture_ms": capture, "replay_ms": replay,
                     "eager_over_replay": eager / replay, "graphs_bit_identical": same,
                     "rel_diff_to_unpadded_eager": rel})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def engine_runs(model, loaded, mode: str, requests: int, new_tokens: int, seed: int) -> list[dict]:
    from gearshift.decode.autoregressive import AutoregressivePolicy
    from gearshift.decode.sampling import SamplingParams
    from gearshift.engine.engine import Engine, Request

    gen = torch.Generator().manual_seed(seed)
    lengths = [int(x) for x in torch.randint(90, 260, (requests,), generator=gen)]
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in lengths]
    rows = []
    outs = {}
    for label, max_rows in (("prefill eager", 0), ("prefill graphs", type(model).graph_max_rows)):
        model.use_cuda_graphs = True
        model.graph_max_rows = max_rows
        model._graphs = None
        for run in range(2):  # the first run captures the decode graphs (and sees each prefill bucket)
            eng = Engine(loaded, max_batch=1)
            res = eng.generate([Request(p, SamplingParams(max_new_tokens=new_tokens, ignore_eos=True))
                                for p in prompts], AutoregressivePolicy(model, mode))
        st = eng.last_stats
        outs[label] = [r.token_ids for r in res]
        rows.append({"mode": mode, "setting": label, "requests": requests, "prompt_lengths": lengths,
                     "new_tokens": new_tokens, "tokens_per_s": st["tokens_per_s"], "wall_s": st["wall_s"],
                     "prefill_ms_per_request": st["prefill_s"] * 1e3 / requests, "decode_s": st.get("decode_s"),
                     "captures": model._graphs.captures})
        print(json.dumps(rows[-1]), flush=True)
    model.graph_max_rows = type(model).graph_max_rows
    model.use_cuda_graphs = False
    same = outs["prefill eager"] == outs["prefill graphs"]
    for r in rows:
        r["same_tokens"] = same
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--modes", default="w4a16,w4a8")
    ap.add_argument("--lengths", default="32,100,200,500,1000", help="prompt tokens per sequence")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--requests", type=int, default=16, help="engine runs: prompts per generation (0 = skip)")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--graph-max-rows", type=int, default=None, metavar="ROWS",
                    help="Transformer.graph_max_rows for the forwards (default: the model's), e.g. 4096 to time "
                    "graphs for prompts past the default")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("prefill_graphs.py times CUDA graphs: it needs a CUDA GPU")

    from e2e import model_for
    from kernel_bench import tag_suffix, write_json

    from gearshift.dispatch.policy import device_slug
    from gearshift.model.loader import LoadedModel

    models: dict = {}
    fw, eng = [], []
    for mode in args.modes.split(","):
        model = model_for(models, args.preset, mode, True)  # int4-prog: W4A8 runs the int8 kernels
        if args.graph_max_rows is not None:
            model.graph_max_rows = args.graph_max_rows
        for b in (int(x) for x in args.batches.split(",")):
            fw += forwards(model, mode, b, [int(x) for x in args.lengths.split(",")], args.reps)
        if args.requests and mode == "w4a16":
            eng += engine_runs(model, LoadedModel(model, None, model.config, args.preset), mode, args.requests,
                               args.new_tokens, seed=0)
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "preset": args.preset,
           "graph_max_rows": model.graph_max_rows, "forwards": fw, "engine": eng}
    write_json(args.out, f"prefill_graphs_{device_slug(doc['device'])}{tag_suffix(args.tag)}.json", doc)
    print(f"\n{'mode':6} {'b':>2} {'tok':>5} {'bkt':>5} {'eager':>7} {'first':>7} {'capt':>7} {'replay':>7} "
          f"{'x':>5} same")
    for r in fw:
        print(f"{r['mode']:6} {r['batch']:2d} {r['tokens']:5d} {r['bucket']:5d} {r['eager_ms']:7.2f} "
              f"{r['first_ms']:7.2f} {r['capture_ms']:7.2f} {r['replay_ms']:7.2f} {r['eager_over_replay']:5.2f} "
              f"{r['graphs_bit_identical']}")
    for r in eng:
        print(f"engine {r['setting']:15} {r['tokens_per_s']:8.1f} tok/s  prefill {r['prefill_ms_per_request']:6.1f} ms  "
              f"captures {r['captures']}  same tokens {r['same_tokens']}")


if __name__ == "__main__":
    main()
