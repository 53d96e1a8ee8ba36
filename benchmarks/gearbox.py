"""GEARBX benchmark: per-gear decode time, shift cost, monitor overhead, device bytes, batch rule,
gear distribution on easy vs hard prompts, and the `gearbx` package's kernels on the same GPU.

GPU part (an 8B-shaped random-weight model built in memory, bf16 dense originals, fewer layers)::

    python benchmarks/gearbox.py gpu --layers 8 --out benchmarks/results/gearbox_gpu.json

CPU part (the embedded SmolLM2-135M-Instruct, real entropies)::

    python benchmarks/gearbox.py cpu --out benchmarks/results/gearbox_cpu.json

Every byte figure is measured from tensors (``WeightFormat.nbytes`` / ``torch.cuda.memory_allocated``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gearshift.decode.entropy import EntropyMonitor  # noqa: E402
from gearshift.decode.gumbel import sanitize_logits  # noqa: E402
from gearshift.decode.precision import PrecisionManager  # noqa: E402

EASY = ["Say hello to me.", "What color is the sky on a clear day?", "Write the word yes three times.",
        "Tell me a short greeting for a friend."]
HARD = ["Prove that the square root of 2 is irrational, step by step.",
        "Solve for x: 3*x^2 - 12*x + 9 = 0, and explain each step.",
        "Write a Python function that returns the n-th Fibonacci number using recursion with memoization.",
        "Compute the integral of x * e^(2x) dx and show the derivation."]


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_ms(fn, n=30, warmup=5):
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def graph_ms(fn, reps=50):
    """Median-free CUDA-graph replay time (ms per call of fn)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(5):
        g.replay()
    sync()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(5):
        e0.record()
        for _ in range(reps):
            g.replay()
        e1.record()
        sync()
        out.append(e0.elapsed_time(e1) / reps)
    return statistics.median(out)


# ------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------

def build_8b(layers: int):
    from gearshift.model.config import ModelConfig
    from gearshift.model.loader import build_transformer
    from gearshift.model.tiny import preset_config, random_tensors

    cfg = preset_config("llama3-8b", num_hidden_layers=layers)
    tensors = dict(random_tensors(cfg, device="cuda", dtype=torch.bfloat16))
    model = build_transformer(ModelConfig.from_hf_dict(cfg), tensors, torch.bfloat16)
    del tensors
    model.to("cuda").eval()
    return model, cfg


class KernelRecorder:
    """Wraps the active dispatcher's linear and records which strategy served each store type."""

    def __init__(self):
        from gearshift.dispatch import get_dispatcher
        from gearshift.dispatch.strategies import STRATEGIES

        self.d = get_dispatcher()
        self.orig = self.d.linear
        self.seen: dict[str, int] = {}
        d, orig, seen = self.d, self.orig, self.seen

        def linear(x, store, act, bias=None):
            m = x.reshape(-1, store.in_features).shape[0]
            c = d.choose(store, act, m) if hasattr(d, "choose") else None
            strat = None if c is None else STRATEGIES.get(c.strategy)
            ok = strat is not None and strat.supports(store, act, c.config)
            key = f"{type(store).__name__}{'/g' + str(store.group_size) if hasattr(store, 'group_size') else ''}" \
                  f" M={m} -> {c.strategy if ok else 'reference(dequant)'}"
            seen[key] = seen.get(key, 0) + 1
            return orig(x, store, act, bias)

        self.d.linear = linear

    def close(self):
        self.d.linear = self.orig


def decode_step_ms(model, steps=40, prompt=32):
    cache = model.new_cache(1, prompt + steps + 16)
    tok = torch.randint(0, model.config.vocab_size, (1, prompt), device="cuda")
    model(tok, cache, [0], [prompt], mode="native", logits="last")
    one = torch.randint(0, model.config.vocab_size, (1, 1), device="cuda")
    ts = []
    for i in range(steps):
        sync()
        t0 = time.perf_counter()
        out = model(one, cache, [prompt + i], [1], mode="native", logits="last")
        out.argmax(-1).item()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts[min(5, len(ts) - 1):]), out


def managed_linears_ms(mgr, m=1):
    """CUDA-graph time of one pass over the managed layers' current stores at M rows."""
    from gearshift.dispatch import run_linear

    xs = {}
    for l in mgr.layers:
        k = l.module.store.in_features
        if k not in xs:
            xs[k] = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)

    def fn():
        for l in mgr.layers:
            run_linear(xs[l.module.store.in_features], l.module.store, None)

    return graph_ms(fn)


def monitor_overhead(vocab, step_ms):
    logits = torch.randn(1, vocab, device="cuda") * 3
    mon = EntropyMonitor(vocab, 1)

    def with_monitor():
        z = sanitize_logits(logits)
        mon.dispatch(z)
        ids = z.argmax(-1)
        mon.fetch(ids)

    def baseline():
        logits.argmax(-1).tolist()

    a = median_ms(with_monitor, n=200)
    b = median_ms(baseline, n=200)
    over = max(a - b, 0.0)
    return {"sample_with_monitor_ms": round(a, 4), "sample_argmax_only_ms": round(b, 4),
            "monitor_overhead_ms": round(over, 4),
            "share_of_step": round(over / (step_ms + over), 4) if step_ms else None}


def shift_costs(model, manage, cache_device):
    mgr = PrecisionManager(model, manage, cache_device=cache_device)
    rows = []
    seq = ["low", "high", "low", "mid", "low", "mid", "high"]
    for g in seq:
        before = torch.cuda.memory_allocated()
        r = mgr.shift(g)
        after = torch.cuda.memory_allocated()
        d = r.as_dict()
        d["memory_allocated_delta_bytes"] = after - before
        d["managed_device_bytes"] = mgr.device_bytes()
        rows.append(d)
    mgr.clear_cache()
    mgr.restore()
    mgr.clear_cache()
    return rows, mgr


def gpu(args):
    from gearshift.decode.sampling import SamplingParams
    from gearshift.engine.engine import Engine, Request
    from gearshift.model.loader import LoadedModel

    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "layers": args.layers,
           "shape": "llama3-8b (hidden 4096, intermediate 14336, 32 heads / 8 kv, vocab 128256), bf16 random weights"}
    try:
        import triton

        res["triton"] = triton.__version__
    except ImportError:
        pass
    model, cfg = build_8b(args.layers)
    res["model_bytes_allocated"] = torch.cuda.memory_allocated()
    vocab = cfg["vocab_size"]

    # ---- per-gear decode time, which kernel ran, device bytes ----
    per_gear = {}
    for manage in ("attention", "attention+mlp"):
        mgr = PrecisionManager(model, manage)
        rows = {}
        for g in ("high", "mid", "low"):
            mgr.shift(g)
            rec = KernelRecorder()
            decode_step_ms(model, steps=2)
            rec.close()
            step, _ = decode_step_ms(model, steps=args.steps)
            rows[g] = {"step_ms": round(step, 3), "managed_linears_graph_ms": round(managed_linears_ms(mgr), 4),
                       "managed_device_bytes": mgr.device_bytes(), "memory_allocated": torch.cuda.memory_allocated(),
                       "kernels": rec.seen}
        mgr.restore()
        mgr.clear_cache()
        hb = rows["high"]["managed_device_bytes"]
        for g in rows:
            rows[g]["managed_bytes_vs_high"] = round(rows[g]["managed_device_bytes"] / hb, 4)
            rows[g]["int4_floor_ms_managed"] = round(rows["low"]["managed_device_bytes"] / 3.0e12 * 1e3, 4)
        per_gear[manage] = rows
        print(manage, json.dumps(rows, indent=1), flush=True)
    res["per_gear"] = per_gear

    # ---- shift cost ----
    res["shift_costs"] = {}
    for manage in ("attention", "attention+mlp"):
        for cdev in ("host", "device"):
            rows, _ = shift_costs(model, manage, cdev)
            res["shift_costs"][f"{manage}/cache_{cdev}"] = rows
            print(manage, cdev, json.dumps(rows), flush=True)

    # ---- monitor overhead ----
    step_high = per_gear["attention"]["high"]["step_ms"]
    step_low = per_gear["attention"]["low"]["step_ms"]
    res["monitor"] = {"vocab": vocab, "vs_high_step": monitor_overhead(vocab, step_high),
                      "vs_low_step": monitor_overhead(vocab, step_low)}
    print(json.dumps(res["monitor"]), flush=True)

    # ---- batch rule on a mixed batch (cold-start gears held: one sequence low, one high) ----
    from gearshift.decode.gearbox import GearboxPolicy
    from gearshift.model.config import ModelConfig

    loaded = LoadedModel(model, None, ModelConfig.from_hf_dict(cfg), "random-8b")
    rules = {}
    for rule in ("max", "split"):
        pol = GearboxPolicy(model, prompt_texts=["hi there friend", "Prove that x^2 + 3*x = y/2 - 1 step by step"],
                            batch_rule=rule, calibrate=False, min_gear_duration=10 ** 6,
                            monitor_kwargs=dict(catastrophic_fraction=2.0))
        eng = Engine(loaded, max_batch=2)
        reqs = [Request(list(range(100, 132)), SamplingParams(max_new_tokens=args.steps, ignore_eos=True))
                for _ in range(2)]
        eng.generate(reqs, pol)  # warm
        pol.close()
        pol.manager.clear_cache()
        pol = GearboxPolicy(model, prompt_texts=["hi there friend", "Prove that x^2 + 3*x = y/2 - 1 step by step"],
                            batch_rule=rule, calibrate=False, min_gear_duration=10 ** 6,
                            monitor_kwargs=dict(catastrophic_fraction=2.0))
        torch.cuda.reset_peak_memory_stats()
        eng.generate([Request(list(range(100, 132)), SamplingParams(max_new_tokens=args.steps, ignore_eos=True))
                      for _ in range(2)], pol)
        st = eng.last_stats
        rules[rule] = {k: st.get(k) for k in ("gear_counts", "wanted_gear_counts", "forwards_by_gear", "decode_s",
                                              "wall_s", "tokens_per_s", "shift_count", "shift_cost_s", "steps")}
        rules[rule]["decode_ms_per_step"] = round(st["decode_s"] / st["steps"] * 1e3, 3)
        rules[rule]["peak_memory_allocated"] = torch.cuda.max_memory_allocated()
        pol.close()
        pol.manager.clear_cache()
    res["batch_rule"] = rules
    print(json.dumps(rules), flush=True)

    # ---- the gearbx package's kernels on the same shapes ----
    res["gearbx"] = gearbx_compare(model, args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print("wrote", args.out)


def gearbx_compare(model, args):
    out = {}
    try:
        import gearbx
        from gearbx.kernels import QuantizedLinear4bit, QuantizedLinear8bit
        from gearbx.triton_kernels import fused_linear
    except Exception as e:  # noqa: BLE001
        return {"error": f"gearbx not importable: {e!r}"}
    import triton.testing
    from torch import nn

    from gearshift.dispatch import run_linear
    from gearshift.quant.rowwise import quantize_rowwise

    out["version"] = getattr(gearbx, "__version__", "?")
    lin0 = dict(model.linear_layers())
    shapes = {"qkv": lin0["model.layers.0.self_attn.qkv_proj"], "o": lin0["model.layers.0.self_attn.o_proj"],
              "gate_up": lin0["model.layers.0.mlp.gate_up_proj"], "down": lin0["model.layers.0.mlp.down_proj"]}
    for name, ql in shapes.items():
        w = ql.store.weight
        n, k = w.shape
        row = {"N": n, "K": k}
        for m in (1, 16):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            x16 = x.half()
            for bits, cls in ((4, QuantizedLinear4bit), (8, QuantizedLinear8bit)):
                ours = quantize_rowwise(w, bits)
                row[f"gearshift_int{bits}_M{m}_us"] = round(
                    triton.testing.do_bench(lambda: run_linear(x, ours, None), return_mode="median") * 1e3, 2)
                try:
                    nl = nn.Linear(k, n, bias=False, device="cuda", dtype=torch.float16)
                    nl.weight.data.copy_(w.half())
                    gm = cls.from_linear(nl).cuda()
                    del nl
                    row[f"gearbx_int{bits}_M{m}_us"] = round(
                        triton.testing.do_bench(lambda: fused_linear(x16, gm), return_mode="median") * 1e3, 2)
                    del gm
                except Exception as e:  # noqa: BLE001
                    row[f"gearbx_int{bits}_M{m}_error"] = repr(e)[:200]
            row[f"bf16_M{m}_us"] = round(triton.testing.do_bench(lambda: run_linear(x, ql.store, None),
                                                                 return_mode="median") * 1e3, 2)
        out[name] = row
        print(name, row, flush=True)
    # the package's own precision manager: shift cost on the same attention shapes
    try:
        from gearbx.precision import PrecisionManager as GbxPM, detect_attn_prefixes

        class Attn(nn.Module):
            def __init__(self):
                super().__init__()
                self.q_proj = nn.Linear(4096, 4096, bias=False)
                self.k_proj = nn.Linear(4096, 1024, bias=False)
                self.v_proj = nn.Linear(4096, 1024, bias=False)
                self.o_proj = nn.Linear(4096, 4096, bias=False)

        class Layer(nn.Module):
            def __init__(self):
                super().__init__()
                self.self_attn = Attn()

        class M(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.layers = nn.ModuleList([Layer() for _ in range(n)])

        hf = M(args.layers).to("cuda", torch.float16)
        pm = GbxPM(hf, detect_attn_prefixes(hf), device="cuda")
        rows = []
        for g in ("low", "high", "low", "mid", "low", "mid", "high"):
            sync()
            t0 = time.perf_counter()
            pm.shift(g)
            sync()
            rows.append({"to": g, "seconds": round(time.perf_counter() - t0, 6),
                         "memory_allocated": torch.cuda.memory_allocated()})
        out["gearbx_shift_costs_attention"] = rows
        del pm, hf
    except Exception as e:  # noqa: BLE001
        out["gearbx_shift_error"] = repr(e)[:300]
    return out


# ------------------------------------------------------------------------------------------------
# CPU: gear distribution on easy vs hard prompts (real SmolLM2), batch rule with real entropies
# ------------------------------------------------------------------------------------------------

def cpu(args):
    from gearshift.decode.gearbox import GearboxPolicy
    from gearshift.decode.sampling import SamplingParams
    from gearshift.engine.engine import Engine, Request
    from gearshift.model.loader import load_model
    import warnings

    warnings.simplefilter("ignore")
    loaded = load_model(None, progress=False)
    eng = Engine(loaded, max_batch=4)
    res = {"device": "cpu", "model": loaded.source, "max_new_tokens": args.tokens, "threads": torch.get_num_threads()}
    for label, prompts in (("easy", EASY), ("hard", HARD)):
        pol = GearboxPolicy(loaded.model, prompt_texts=prompts, tokenizer=loaded.tokenizer)
        reqs = [Request(eng.encode_prompt(p), SamplingParams(max_new_tokens=args.tokens)) for p in prompts]
        out = eng.generate(reqs, pol)
        st = eng.last_stats
        res[label] = {"gear_counts": st["gear_counts"], "wanted_gear_counts": st["wanted_gear_counts"],
                      "gear_distribution": st["gear_distribution"], "shift_count": st["shift_count"],
                      "sequence_shifts": st["sequence_shifts"], "shift_cost_s": st["shift_cost_s"],
                      "shift_cost_by_kind": st["shift_cost_by_kind"],
                      "tokens_per_s": st["tokens_per_s"],
                      "per_request": [{"initial_gear": r.stats["gearbox"]["initial_gear"],
                                       "theta": [r.stats["gearbox"]["theta_low"], r.stats["gearbox"]["theta_high"]],
                                       "mean_entropy": round(statistics.mean(r.stats["gearbox"]["entropy"]), 3),
                                       "gears": {g: r.stats["gearbox"]["gear"].count(g) for g in ("low", "mid", "high")},
                                       "text": (r.text or "")[:80]} for r in out]}
        if label == "hard":
            from gearshift.cli.trace import render_traces

            render_traces([(f"hard {i}", r.stats["gearbox"]) for i, r in enumerate(out[:2])],
                          Path(args.out).with_suffix(".png"))
        pol.close()
        print(label, json.dumps(res[label]), flush=True)
    # batch rule with real entropies: two easy + two hard prompts in one batch
    mixed = EASY[:2] + HARD[:2]
    for rule in ("max", "split"):
        pol = GearboxPolicy(loaded.model, prompt_texts=mixed, batch_rule=rule)
        reqs = [Request(eng.encode_prompt(p), SamplingParams(max_new_tokens=args.tokens)) for p in mixed]
        eng.generate(reqs, pol)
        st = eng.last_stats
        res[f"mixed_{rule}"] = {k: st[k] for k in ("gear_counts", "wanted_gear_counts", "forwards_by_gear",
                                                   "decode_s", "steps", "shift_count", "shift_cost_s",
                                                   "shift_cost_by_kind", "tokens_per_s")}
        pol.close()
        print(rule, json.dumps(res[f"mixed_{rule}"]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print("wrote", args.out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["gpu", "cpu"])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.out = args.out or f"benchmarks/results/gearbox_{args.part}.json"
    gpu(args) if args.part == "gpu" else cpu(args)


if __name__ == "__main__":
    main()
