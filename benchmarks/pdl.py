"""Programmatic dependent launch for the small-M linears: correctness and one decode step (GPU).

For M = 1..16 tokens: one 32-layer step of the Llama-3-8B linears (4 shapes x 32 layers,
distinct random weights, CUDA-graph replay, the policy map's tile per shape) with the fragment
kernel launched plainly, with PDL letting the next kernel in at exit / at start / after the main
loop (`pdl_trigger`), with the engine's rule, and with the bulk L2 prefetch; then the dispatcher
for W4A16 and W4A8 with PDL off and on, and torch's tinygemm int4 kernel as the library baseline.
Every timing is repeated (--repeats) and the ratio to the int4 floor (weight bytes / copy
bandwidth measured in the same run) reported. Checks first: every variant bit-identical to the
plain launch, also inside a CUDA graph.

    python benchmarks/pdl.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gearshift.dispatch.dispatcher import AdaptiveDispatcher  # noqa: E402
from gearshift.dispatch.policy import load_policy_for_device  # noqa: E402
from gearshift.dispatch.profiler import PRESETS, copy_bandwidth, random_store, time_us  # noqa: E402
from gearshift.kernels.config import TileConfig  # noqa: E402
from gearshift.kernels.int4_mma_gemv import mma_config, mma_gemv, mma_gemv_quantized, pdl_trigger  # noqa: E402
from gearshift.kernels.library import to_tinygemm  # noqa: E402
from benchmarks.kernels import Model, step_fn, tinygemm_step  # noqa: E402
from gearshift.kernels.pdl import pdl_enabled, set_pdl  # noqa: E402
from gearshift.quant.modes import MODES  # noqa: E402

# name -> (pdl, l2_prefetch, trigger); trigger None = the engine's rule (pdl_trigger)
VARIANTS = {"plain": (False, False, 0), "pdl@exit": (True, False, 0), "pdl@start": (True, False, 1),
            "pdl@loop-end": (True, False, 2), "pdl rule": (True, False, None), "l2 prefetch": (False, True, 0),
            "pdl rule + l2 prefetch": (True, True, None)}


def check(shapes, dtype) -> list:
    bad = []
    for name, n, k in shapes:
        st = random_store("int4", n, k, 128, "cuda", dtype)
        for m in (1, 2, 5, 9, 16):
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            for cfg in (mma_config(n, k, m), TileConfig(16, 0, 128, 2, 4, 1, prefetch=True)):
                base = mma_gemv(x, st, cfg, pdl=False, l2_prefetch=False)
                for v, (p, l2, tr) in VARIANTS.items():
                    if not torch.equal(mma_gemv(x, st, cfg, pdl=p, l2_prefetch=l2, trigger=tr), base):
                        bad.append(f"{name} M={m} {cfg.key()} {v}")
            for pdl in (False, True):
                set_pdl(pdl)
                y = mma_gemv_quantized(x, st, MODES["w4a8"].act, mma_config(n, k, m))
                if pdl and not torch.equal(y, y_plain):
                    bad.append(f"{name} M={m} w4a8")
                y_plain = y
            set_pdl(True)
    # a dependent chain (each output feeds the next input) captured in a CUDA graph
    st = random_store("int4", 4096, 4096, 128, "cuda", dtype)
    x = torch.randn(1, 4096, device="cuda", dtype=dtype)

    def chain(p):
        h = x
        for i in range(16):
            h = mma_gemv(h, st, mma_config(4096, 4096, 1), pdl=p, trigger=i % 3) * 0.01 + x
        return h
    ref = chain(False)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        chain(True)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        out = chain(True)
    g.replay()
    torch.cuda.synchronize()
    if not torch.equal(out, ref):
        bad.append("graph chain")
    return bad


def decode_stage(batches: list[int], repeats: int) -> dict:
    """GPU ms of one decode step: the engine's captured graph (PDL off / on) replayed back to back."""
    from gearshift.decode.autoregressive import AutoregressivePolicy
    from gearshift.decode.sampling import SamplingParams
    from gearshift.engine.engine import Engine, Request
    from gearshift.model.config import ModelConfig
    from gearshift.model.loader import LoadedModel
    from gearshift.model.tiny import build_random_model, preset_config

    cfg = ModelConfig.from_hf_dict(preset_config("llama3-8b"))
    model = build_random_model("llama3-8b", weights="int4", device="cuda")
    loaded = LoadedModel(model, None, cfg, "llama3-8b")
    model.use_cuda_graphs = True
    out = {}
    for b in batches:
        graphs, engines = {}, []  # the engines own the KV caches the graphs write into: keep them alive
        for p in (False, True):
            set_pdl(p)
            model._graphs = None  # capture afresh with this launch mode
            eng = Engine(loaded, max_batch=b)
            reqs = [Request(list(range(10 + i, 42 + i)), SamplingParams(max_new_tokens=16, ignore_eos=True))
                    for i in range(b)]
            eng.generate(reqs, AutoregressivePolicy(model, "w4a16"))
            engines.append(eng)
            graphs[p] = max(model._graphs.graphs.values(), key=lambda g: g.tokens.shape[0] * (g.tokens.shape[1] == 1))
        set_pdl(True)
        ts = {False: [], True: []}
        for _ in range(repeats * 2):
            for p, g in graphs.items():
                for _ in range(3):
                    g.graph.replay()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(20):
                    g.graph.replay()
                e1.record()
                torch.cuda.synchronize()
                ts[p].append(e0.elapsed_time(e1) / 20)
        same = torch.equal(graphs[False].out, graphs[True].out)
        out[str(b)] = {"plain_ms": statistics.median(ts[False]), "pdl_ms": statistics.median(ts[True]),
                       "plain_all": ts[False], "pdl_all": ts[True], "same_logits": same}
        print(f"decode batch {b}: plain {out[str(b)]['plain_ms']:.3f} ms, pdl {out[str(b)]['pdl_ms']:.3f} ms, "
              f"same logits {same}", flush=True)
        del graphs, engines
    model._graphs = None
    del model
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--m", default="1,2,4,8,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stages", default="linears,decode",
                    help="linears: the 32-layer step of linears; decode: GPU time of the engine's captured "
                         "decode-step graph (random-weight 8B model), PDL off and on")
    ap.add_argument("--batches", default="1,16", help="batch sizes of the decode stage")
    args = ap.parse_args()
    stages = args.stages.split(",")
    dtype = torch.bfloat16
    shapes = PRESETS["llama3-8b"]["shapes"]
    dev = torch.cuda.get_device_name()
    if not pdl_enabled(torch.zeros(1, device="cuda")):
        sys.exit(f"PDL is not available here ({dev}, triton): nothing to compare")
    res: dict = {"device": dev, "torch": torch.__version__, "variants": {k: list(v) for k, v in VARIANTS.items()}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slug = dev.replace(" ", "_")
    if "decode" in stages:
        res["decode"] = decode_stage([int(b) for b in args.batches.split(",")], args.repeats)
        (out / f"pdl_{slug}.json").write_text(json.dumps(res, indent=1))
    if "linears" not in stages:
        return
    res["check_failures"] = check(shapes, dtype)
    print("check: mismatches", res["check_failures"] or "none", flush=True)
    bw = copy_bandwidth()
    model = Model("int4", shapes, 32, 128, dtype)
    floor = model.nbytes() / bw * 1e3
    res.update(copy_bandwidth_GBps=bw / 1e9, floor_ms=floor, ms={})
    pm = load_policy_for_device()
    res["policy_map"] = pm is not None

    def rec(name, m, ms):
        res["ms"].setdefault(name, {}).setdefault(str(m), []).append(round(ms, 4))

    ms_list = [int(v) for v in args.m.split(",")]
    for m in ms_list:
        xs = [torch.randn(m, k, device="cuda", dtype=dtype) for _, _, k in shapes]
        cfgs = {}
        for name, n, k in shapes:
            c = pm.lookup(f"w4a16:g128:{n}x{k}", m) if pm is not None else None
            cfgs[(n, k)] = c.config if c is not None and c.strategy == "w4a16_mma" else mma_config(n, k, m)
        for _ in range(args.repeats):
            for v, (p, l2, tr) in VARIANTS.items():
                fn = (lambda x_, s_, p=p, l2=l2, tr=tr:
                      mma_gemv(x_, s_, cfgs[(s_.out_features, s_.in_features)], pdl=p, l2_prefetch=l2, trigger=tr))
                rec(f"fragment kernel: {v}", m, time_us([step_fn(model, xs, fn)], rounds=1, reps=7) / 1e3)
            for mode in ("w4a16", "w4a8"):
                for p in (False, True):
                    set_pdl(p)
                    d = AdaptiveDispatcher(pm, autoload=False)
                    act = MODES[mode].act
                    rec(f"dispatch {mode}: {'pdl' if p else 'plain'}", m,
                        time_us([step_fn(model, xs, lambda x_, s_: d.linear(x_, s_, act))], rounds=1, reps=7) / 1e3)
            set_pdl(True)
        print(f"M={m} done", flush=True)
    tg = [[(to_tinygemm(s), s.group_size) for s in layer] for layer in model.stores]
    for m in [v for v in ms_list if v <= 4]:
        xs = [torch.randn(m, k, device="cuda", dtype=dtype) for _, _, k in shapes]
        for _ in range(args.repeats):
            rec("lib: tinygemm", m, time_us([tinygemm_step(tg, xs)], rounds=1, reps=7) / 1e3)
    res["rule"] = {str(m): pdl_trigger(m) for m in ms_list}
    (out / f"pdl_{slug}.json").write_text(json.dumps(res, indent=1))
    lines = [f"# PDL for the small-M linears: {dev}", "",
             "One 32-layer decode step of the Llama-3-8B linears (4 shapes x 32 layers, distinct weights), "
             f"CUDA-graph replay, median of {args.repeats} repeats, ms. Copy bandwidth in the same run "
             f"{bw / 1e12:.2f} TB/s, int4 floor {floor:.3f} ms. Bit-identical outputs in every variant: "
             f"{'yes' if not res['check_failures'] else 'NO: ' + ', '.join(res['check_failures'])}.",
             "", "| variant | " + " | ".join(f"M={m}" for m in ms_list) + " |", "|---|" + "---|" * len(ms_list)]
    for name, per in res["ms"].items():
        cells = []
        for m in ms_list:
            v = per.get(str(m))
            cells.append("-" if not v else f"{statistics.median(v):.3f} ({statistics.median(v) / floor:.2f}x)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "(x) = ratio to the int4 floor. Rule (`pdl_trigger`): " +
              ", ".join(f"M={m}: {['exit', 'start', 'loop end'][t]}" for m, t in res["rule"].items()) + "."]
    if "decode" in res:
        lines += ["", "Whole decode step (W4A16, random-weight Llama-3-8B, the engine's captured graph replayed "
                  "back to back: GPU time only, no host work), ms, median of the repeats:", "",
                  "| batch | plain | pdl | pdl / plain | same logits |", "|---|---|---|---|---|"]
        for b, r in res["decode"].items():
            lines.append(f"| {b} | {r['plain_ms']:.3f} | {r['pdl_ms']:.3f} | {r['pdl_ms'] / r['plain_ms']:.3f} | "
                         f"{r['same_logits']} |")
    (out / "pdl.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
