"""QSPEC speed on an 8B-shaped random-weight model, and QSPEC acceptance on SmolLM2-135M.

Stages:
  gpu      (CUDA) builds Llama-3-8B shapes in memory with random int4 stores (group 128) and
           measures, EAGER (no CUDA graphs: host-bound, ~40-55 ms per 8B step; the engine's
           graphed QSPEC against AR is benchmarks/e2e_policies.py's), (1) per-forward step
           times: t_mode(B) for T=1 in w4a16 / w4a8 / w4a4 and t_verify(B, gamma) = one w4a16
           forward of B rows x (gamma+1) tokens (M = B(gamma+1)), and (2) end-to-end Engine
           tokens/s of AR (w4a16, w4a8, w4a4) and QSPEC (w4a4 draft, gamma 2..6) at each batch size. Random weights make the draft/verify agreement
           meaningless, so (3) the DESIGN.md speed-up formula is evaluated with the measured step
           times and acceptance rates from a trained model (modeled, not measured). Records which
           kernels (dispatcher strategies) ran for each mode and M.
  smollm2  (CPU is fine) greedy acceptance of QSPEC at gamma 3 (w4a4 and w4a8 drafts) on the real
           SmolLM2-135M-Instruct Q4_1 GGUF over 10 chat prompts, and whether its tokens equal
           greedy w4a16 AR (the lossless contract on a trained model).
  kernels  (CUDA) kernel-bound step costs: CUDA-graph replay of the 32 x 4 int4 linears (+ lm_head)
           per mode and M (no host overhead), and a host profile of the eager forward.
  report   JSON(s) -> Markdown summary.

Usage:
  python benchmarks/qspec.py gpu --out benchmarks/results/qspec_h100.json [--batches 1,8,16,32,64]
  python benchmarks/qspec.py smollm2 --out benchmarks/results/qspec_smollm2.json
  python benchmarks/qspec.py kernels --out benchmarks/results/qspec_kernels_h100.json
  python benchmarks/qspec.py report --gpu benchmarks/results/qspec_h100.json \
      --kernels benchmarks/results/qspec_kernels_h100.json --smollm2 benchmarks/results/qspec_smollm2_cpu.json \
      --notes benchmarks/results/qspec_notes.md --md benchmarks/results/qspec.md
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

from gearshift.decode.autoregressive import AutoregressivePolicy  # noqa: E402
from gearshift.decode.qspec import QSpecPolicy, tokens_per_cycle  # noqa: E402
from gearshift.decode.sampling import SamplingParams  # noqa: E402
from gearshift.engine.engine import Engine, Request  # noqa: E402
from gearshift.jsonfile import read_json, resolve  # noqa: E402

PAPER_ACCEPTANCE = 0.9  # QSPEC paper, Llama-3-8B-Instruct, W4A4 draft (Tables 8-10: 0.83-0.97)

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain what a neural network is in two sentences.",
    "List three tips for staying healthy.",
    "How do I reverse a list in Python?",
    "What is 12 times 7? Explain step by step.",
    "Give me a recipe for pancakes.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet.",
    "Translate 'good morning' into Spanish and German.",
]



# ---- the GPU stage ---------------------------------------------------------------------------------

def build_8b(device="cuda", dtype=torch.bfloat16, layers: int | None = None, preset: str = "llama3-8b"):
    """Llama-3-8B shapes, random int4 stores (group 128) made directly on the GPU (no quantization pass)."""
    from gearshift.dispatch.profiler import random_store
    from gearshift.model.config import ModelConfig
    from gearshift.model.loader import LoadedModel, build_transformer
    from gearshift.model.tiny import preset_config

    cfg = preset_config(preset)
    if layers:
        cfg["num_hidden_layers"] = layers
    config = ModelConfig.from_hf_dict(cfg)
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    g = torch.Generator(device=device).manual_seed(0)
    t = {"model.embed_tokens.weight": (torch.randn(v, h, device=device, generator=g) * 0.02).to(dtype),
         "lm_head.weight": (torch.randn(v, h, device=device, generator=g) * 0.02).to(dtype),
         "model.norm.weight": torch.ones(h, device=device, dtype=dtype)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = torch.ones(h, device=device, dtype=dtype)
        t[f"{p}.post_attention_layernorm.weight"] = torch.ones(h, device=device, dtype=dtype)
        t[f"{p}.self_attn.qkv_proj.weight"] = random_store("int4", (nh + 2 * nkv) * hd, h, 128, device)
        t[f"{p}.self_attn.o_proj.weight"] = random_store("int4", h, nh * hd, 128, device)
        t[f"{p}.mlp.gate_up_proj.weight"] = random_store("int4", 2 * inter, h, 128, device)
        t[f"{p}.mlp.down_proj.weight"] = random_store("int4", h, inter, 128, device)
    model = build_transformer(config, t, dtype).to(device).eval()
    return LoadedModel(model, None, config, f"random {preset} int4 g128", {})


def use_policy_map(path: str | None) -> str | None:
    """Install the policy map at `path`, or by default the one the engine would load on this GPU
    (`install_policy`: the user's, else the map shipped for this GPU); its file or device name."""
    from gearshift.dispatch import AdaptiveDispatcher, PolicyMap, install_policy, set_dispatcher

    if not torch.cuda.is_available():
        return None
    if not path:
        from gearshift.dispatch.policy import describe

        return describe(install_policy().policy)
    set_dispatcher(AdaptiveDispatcher(PolicyMap.load(path), autoload=False))
    return str(path)


class KernelLog:
    """Wraps the active dispatcher's `choose` to record the strategy per (mode, M)."""

    def __init__(self):
        from gearshift.dispatch import get_dispatcher

        self.d = get_dispatcher()
        self.seen: dict[str, dict[str, str]] = {}
        self.orig = getattr(self.d, "choose", None)
        if self.orig is not None:
            def choose(store, act, m):
                from gearshift.dispatch.strategies import mode_key

                c = self.orig(store, act, m)
                key = f"{mode_key(store, act)} N{store.out_features} K{store.in_features}"
                self.seen.setdefault(key, {})[str(m)] = "reference" if c is None else c.strategy
                return c

            self.d.choose = choose

    def summary(self) -> dict:
        return {"dispatcher": type(self.d).__name__, "policy_map": getattr(getattr(self.d, "policy", None), "device", None),
                "choices": self.seen}


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def step_time(model, mode: str, b: int, t: int, ctx: int, reps: int = 10) -> float:
    """Seconds per forward of b rows x t new tokens at context ctx (what a policy step runs)."""
    cache = model.new_cache(b, ctx + t + 1)
    cache.lengths = [ctx] * b
    tokens = torch.randint(0, model.config.vocab_size, (b, t), device=model.device)
    logits = "last" if t == 1 else "all"
    for _ in range(3):
        model(tokens, cache, [ctx] * b, [t] * b, mode=mode, logits=logits)
    sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model(tokens, cache, [ctx] * b, [t] * b, mode=mode, logits=logits)
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def e2e(loaded, policy, b: int, prompt_len: int, new: int, warm: bool = True) -> dict:
    if warm:  # compile every kernel shape this run will meet (prefill M, decode/draft/verify M) first
        e2e(loaded, policy, b, prompt_len, min(new, 2 + getattr(policy, "gamma", 0) * 2), warm=False)
        policy.timer.totals.clear()
        policy.counters.update({k: 0 for k in policy.counters})
    g = torch.Generator().manual_seed(b)
    reqs = [Request(torch.randint(0, loaded.config.vocab_size, (prompt_len,), generator=g).tolist(),
                    SamplingParams(max_new_tokens=new, ignore_eos=True)) for _ in range(b)]
    eng = Engine(loaded, max_batch=b)
    eng.generate(reqs, policy)
    st = eng.last_stats
    keep = ("tokens_per_s", "wall_s", "generated_tokens", "prefill_s", "decode_s", "draft_s", "verify_s",
            "acceptance_rate", "mean_accepted_length", "cycles", "draft_forwards")
    out = {k: st[k] for k in keep if k in st}
    # decode-only throughput (prefill excluded): what the step-time model predicts
    dec = st.get("decode_s", 0.0) + st.get("draft_s", 0.0) + st.get("verify_s", 0.0)
    out["decode_tokens_per_s"] = round(st["generated_tokens"] / dec, 2) if dec else None
    return out


def run_gpu(args) -> None:
    out_path = Path(args.out)
    batches = [int(x) for x in args.batches.split(",")]
    gammas = [int(x) for x in args.gammas.split(",")]
    dev = args.device
    res: dict = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__, "batches": batches,
                 "gammas": gammas, "prompt_len": args.prompt_len, "new_tokens": args.new, "ctx": args.ctx,
                 "model": f"{args.preset} shapes, random int4 g128 stores, bf16 activations", "steps": {}, "e2e": {}}
    try:
        import triton

        res["triton"] = triton.__version__
    except ImportError:
        res["triton"] = None

    def save():
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(res, indent=1))

    t0 = time.time()
    res["policy_map_file"] = use_policy_map(args.policy_map)
    loaded = build_8b(dev, layers=args.layers, preset=args.preset)
    res["build_s"] = round(time.time() - t0, 1)
    log = KernelLog()
    model = loaded.model
    print(f"built in {res['build_s']} s", flush=True)
    # step times
    for b in batches:
        row = {}
        for mode in ("w4a16", "w4a8", "w4a4"):
            row[f"t_{mode}"] = step_time(model, mode, b, 1, args.ctx)
        for g in gammas:
            row[f"t_verify_g{g}"] = step_time(model, "w4a16", b, g + 1, args.ctx)
        res["steps"][str(b)] = row
        print(b, {k: round(v * 1e3, 2) for k, v in row.items()}, flush=True)
        save()
    res["kernels"] = log.summary()
    save()
    # end to end
    for b in batches:
        row = {}
        for mode in ("w4a16", "w4a8", "w4a4"):
            row[f"ar_{mode}"] = e2e(loaded, AutoregressivePolicy(model, mode), b, args.prompt_len, args.new)
        for g in gammas:
            if time.time() - t0 > args.budget_s:
                row[f"qspec_g{g}"] = "skipped (time budget)"
                continue
            row[f"qspec_g{g}"] = e2e(loaded, QSpecPolicy(model, "w4a4", "w4a16", g), b, args.prompt_len, args.new)
        res["e2e"][str(b)] = row
        print(b, {k: (v.get("decode_tokens_per_s") if isinstance(v, dict) else v) for k, v in row.items()}, flush=True)
        save()
    res["kernels"] = log.summary()
    res["total_s"] = round(time.time() - t0, 1)
    save()


# ---- kernel-bound step costs (CUDA-graph replay of the 32-layer linear stack) -----------------------

def run_kernels(args) -> None:
    """Per-step GPU time of all linears (+ the w16a16 lm_head) per mode and M, launch overhead removed.

    This is the step cost an engine pays once its host overhead is gone (CUDA graphs): the
    regime DESIGN.md's formula is about. Attention, norms and sampling are not included.
    """
    import cProfile
    import io
    import pstats

    from gearshift.dispatch import run_linear
    from gearshift.dispatch.profiler import time_us
    from gearshift.quant.modes import get_mode

    batches = [int(x) for x in args.batches.split(",")]
    gammas = [int(x) for x in args.gammas.split(",")]
    out_path = Path(args.out)
    res = json.loads(out_path.read_text()) if out_path.exists() else {}
    t0 = time.time()
    res["policy_map_file"] = use_policy_map(args.policy_map)
    loaded = build_8b(layers=args.layers)
    log = KernelLog()
    model = loaded.model
    lins = [(n, lin) for n, lin in model.linear_layers() if n != "lm_head"]
    head = model.lm_head

    def stack_ms(mode: str, m: int) -> dict:
        act = get_mode(mode).act
        xs = {k: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k in {lin.in_features for _, lin in lins}}
        calls = [(lambda lin=lin: run_linear(xs[lin.in_features], lin.store, act)) for _, lin in lins]
        lin_ms = time_us(calls) * len(calls) / 1e3
        xh = torch.randn(m, head.in_features, device="cuda", dtype=torch.bfloat16)
        head_ms = time_us([lambda: head(xh, mode)]) / 1e3
        return {"linears_ms": round(lin_ms, 4), "lm_head_ms": round(head_ms, 4)}

    kt: dict = {}
    for mode in ("w4a16", "w4a8", "w4a4"):
        ms = set(batches)
        if mode == "w4a16":
            ms |= {b * (g + 1) for b in batches for g in gammas}
        for m in sorted(ms):
            kt.setdefault(mode, {})[str(m)] = stack_ms(mode, m)
            print(mode, m, kt[mode][str(m)], flush=True)
        res["kernel_steps"] = kt
        out_path.write_text(json.dumps(res, indent=1))
    res["kernel_steps_kernels"] = log.summary()
    # where the eager forward's time goes (host profile of warm forwards)
    prof = {}
    for b in (1, 8):
        step_time(model, "w4a16", b, 1, args.ctx, reps=2)
        pr = cProfile.Profile()
        pr.enable()
        t = step_time(model, "w4a16", b, 1, args.ctx, reps=10)
        pr.disable()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(18)
        prof[str(b)] = {"step_s": t, "profile": buf.getvalue()[-6000:]}
        print(buf.getvalue()[-3000:], flush=True)
    res["host_profile"] = prof
    res["kernels_total_s"] = round(time.time() - t0, 1)
    out_path.write_text(json.dumps(res, indent=1))


# ---- SmolLM2 acceptance (CPU) -----------------------------------------------------------------------

def run_smollm2(args) -> None:
    from gearshift.model.loader import load_model

    torch.set_num_threads(max(1, torch.get_num_threads()))
    lm = load_model(None, progress=False)
    eng = Engine(lm, max_batch=len(CHAT_PROMPTS))
    reqs = lambda: [Request(eng.encode_prompt(p), SamplingParams(max_new_tokens=args.new))  # noqa: E731
                    for p in CHAT_PROMPTS]
    res = {"model": lm.source, "weights": lm.weight_summary(), "prompts": CHAT_PROMPTS, "new_tokens": args.new,
           "gamma": args.gamma, "device": "cpu", "runs": {}}
    ar = eng.generate(reqs(), AutoregressivePolicy(lm.model, "w4a16"))
    res["runs"]["ar_w4a16"] = {"tokens_per_s": eng.last_stats["tokens_per_s"]}
    ref = [r.token_ids for r in ar]
    for draft in ("w4a4", "w4a8"):
        t0 = time.time()
        out = eng.generate(reqs(), QSpecPolicy(lm.model, draft, "w4a16", args.gamma))
        st = eng.last_stats
        same = [r.token_ids == a for r, a in zip(out, ref)]
        res["runs"][f"qspec_{draft}"] = {
            "acceptance_rate": st["acceptance_rate"], "mean_accepted_length": st["mean_accepted_length"],
            "drafted": st["drafted"], "accepted": st["accepted"], "draft_s": st["draft_s"],
            "verify_s": st["verify_s"], "tokens_per_s": st["tokens_per_s"],
            "per_prompt_acceptance": [r.stats.get("acceptance_rate") for r in out],
            "identical_to_ar_w4a16": sum(same), "of": len(same), "wall_s": round(time.time() - t0, 1)}
        print(draft, res["runs"][f"qspec_{draft}"], flush=True)
    res["sample_output"] = ar[0].text
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))


# ---- report ----------------------------------------------------------------------------------------

def speedup(steps: dict, b: int, g: int, tpc: float, draft: str = "w4a4") -> float:
    s = steps[str(b)]
    return tpc * s["t_w4a16"] / (g * s[f"t_{draft}"] + s[f"t_verify_g{g}"])


def run_report(args) -> None:
    gpu = read_json(args.gpu)
    smol = read_json(args.smollm2) if args.smollm2 and resolve(args.smollm2).exists() else None
    L = [f"# QSPEC benchmark ({gpu['device']})", ""]
    L.append(f"Model: {gpu['model']}; context {gpu['ctx']} tokens for step times; end-to-end: prompt "
             f"{gpu['prompt_len']} random tokens, {gpu['new_tokens']} new tokens per sequence, greedy. "
             f"torch {gpu['torch']}, triton {gpu.get('triton')}. Command: `python benchmarks/qspec.py gpu ...` "
             f"(see the JSON).")
    L += ["", "## Measured step times (ms per forward, median of 10)", "",
          "| B | t_w4a16(B) | t_w4a8(B) | t_w4a4(B) | " + " | ".join(f"t_verify g{g}" for g in gpu["gammas"]) + " |",
          "|---|---|---|---|" + "---|" * len(gpu["gammas"])]
    for b in gpu["batches"]:
        s = gpu["steps"].get(str(b))
        if not s:
            continue
        L.append(f"| {b} | {s['t_w4a16'] * 1e3:.2f} | {s['t_w4a8'] * 1e3:.2f} | {s['t_w4a4'] * 1e3:.2f} | "
                 + " | ".join(f"{s[f't_verify_g{g}'] * 1e3:.2f}" for g in gpu["gammas"]) + " |")
    L += ["", "t_verify gG = one w4a16 forward of B rows x (G+1) tokens (M = B(G+1)), what QSPEC's verify runs.", ""]
    alphas = [("paper", PAPER_ACCEPTANCE)]
    if smol:
        for d in ("w4a4", "w4a8"):
            r = smol["runs"].get(f"qspec_{d}")
            if r:
                alphas.append((f"SmolLM2 {d}", r["acceptance_rate"]))
    L += ["## Modeled speed-up over W4A16 AR (DESIGN.md formula, measured step times, w4a4 draft)", "",
          "speed-up = tokens_per_cycle(alpha, gamma) x t_w4a16(B) / (gamma t_w4a4(B) + t_verify(B, gamma)), "
          "tokens_per_cycle = (1 - alpha^(gamma+1)) / (1 - alpha). Step times are measured here; the acceptance "
          "alpha is NOT measured on this random model: " + ", ".join(f"{n} alpha={a:.3f}" for n, a in alphas)
          + ". alpha=1 is the upper bound.", ""]
    for name, a in alphas + [("upper bound", 1.0)]:
        L.append(f"**alpha = {a:.3f} ({name})**")
        L.append("")
        L.append("| B | " + " | ".join(f"g{g}" for g in gpu["gammas"]) + " |")
        L.append("|---|" + "---|" * len(gpu["gammas"]))
        for b in gpu["batches"]:
            if str(b) not in gpu["steps"]:
                continue
            L.append(f"| {b} | " + " | ".join(f"{speedup(gpu['steps'], b, g, tokens_per_cycle(a, g)):.2f}"
                                              for g in gpu["gammas"]) + " |")
        L.append("")
    kt = read_json(args.kernels).get("kernel_steps") if args.kernels and \
        Path(args.kernels).exists() else None
    if kt:
        def ks(mode, m):
            r = kt.get(mode, {}).get(str(m))
            return None if r is None else r["linears_ms"] + r["lm_head_ms"]

        L += ["## Measured kernel-bound step costs (CUDA-graph replay of the 32 x 4 int4 linears + the bf16 lm_head)",
              "", "No host overhead, no attention/norms: the cost an engine approaches once it replays CUDA graphs.",
              "", "| B | w4a16(B) ms | w4a8(B) ms | w4a4(B) ms | " + " | ".join(f"w4a16(B x {g + 1}) ms" for g in gpu["gammas"])
              + " |", "|---|---|---|---|" + "---|" * len(gpu["gammas"])]
        for b in gpu["batches"]:
            vals = [ks("w4a16", b), ks("w4a8", b), ks("w4a4", b)] + [ks("w4a16", b * (g + 1)) for g in gpu["gammas"]]
            L.append(f"| {b} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in vals) + " |")
        L += ["", "Modeled speed-up from these kernel-bound costs (same formula; alpha as above):", ""]
        for draft in ("w4a4", "w4a8"):
            for name, a in alphas + [("upper bound", 1.0)]:
                L.append(f"- draft {draft}, alpha {a:.3f} ({name}): " + "; ".join(
                    f"B={b}: " + " ".join(
                        f"g{g} {tokens_per_cycle(a, g) * ks('w4a16', b) / (g * ks(draft, b) + ks('w4a16', b * (g + 1))):.2f}"
                        for g in gpu["gammas"] if ks("w4a16", b * (g + 1)) and ks(draft, b))
                    for b in gpu["batches"] if ks("w4a16", b)))
        L.append("")
    if gpu.get("e2e"):
        L += ["## Measured end-to-end decode tokens/s (Engine, prefill excluded; random weights)", "",
              "| B | AR w4a16 | AR w4a8 | AR w4a4 | " + " | ".join(f"QSPEC g{g} (acc)" for g in gpu["gammas"]) + " |",
              "|---|---|---|---|" + "---|" * len(gpu["gammas"])]
        for b in gpu["batches"]:
            r = gpu["e2e"].get(str(b))
            if not r:
                continue

            def cell(x):
                if not isinstance(x, dict):
                    return "-"
                acc = x.get("acceptance_rate")
                return f"{x['decode_tokens_per_s']:.1f}" + (f" ({acc:.2f})" if acc is not None else "")

            L.append(f"| {b} | {cell(r['ar_w4a16'])} | {cell(r['ar_w4a8'])} | {cell(r['ar_w4a4'])} | "
                     + " | ".join(cell(r.get(f"qspec_g{g}")) for g in gpu["gammas"]) + " |")
        L.append("")
    if smol:
        L += ["## Acceptance on SmolLM2-135M-Instruct (Q4_1 GGUF, CPU, greedy, gamma "
              f"{smol['gamma']}, {len(smol['prompts'])} chat prompts, {smol['new_tokens']} new tokens)", "",
              "| draft | acceptance rate | tokens / cycle | identical to AR w4a16 |", "|---|---|---|---|"]
        for d in ("w4a4", "w4a8"):
            r = smol["runs"].get(f"qspec_{d}")
            if r:
                L.append(f"| {d} | {r['acceptance_rate']:.3f} | {r['mean_accepted_length']:.2f} | "
                         f"{r['identical_to_ar_w4a16']}/{r['of']} |")
        L.append("")
    k = gpu.get("kernels", {})
    if k:
        L += ["## Kernels that ran (dispatcher strategy per mode, shape and M)", "",
              f"dispatcher {k.get('dispatcher')}, policy map: {k.get('policy_map') or 'none (rule-based defaults)'}", ""]
        for key, ms in sorted(k.get("choices", {}).items()):
            by: dict[str, list[str]] = {}
            for m, s in sorted(ms.items(), key=lambda x: int(x[0])):
                by.setdefault(s, []).append(m)
            L.append(f"- {key}: " + "; ".join(f"{s} (M={','.join(v)})" for s, v in by.items()))
        L.append("")
    if args.notes and Path(args.notes).exists():
        L += [Path(args.notes).read_text()]
    Path(args.md).write_text("\n".join(L) + "\n")
    print("\n".join(L))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="stage", required=True)
    g = sub.add_parser("gpu")
    g.add_argument("--out", required=True)
    g.add_argument("--batches", default="1,8,16,32,64")
    g.add_argument("--gammas", default="2,3,4,5,6")
    g.add_argument("--ctx", type=int, default=64)
    g.add_argument("--prompt-len", type=int, default=32)
    g.add_argument("--new", type=int, default=24)
    g.add_argument("--layers", type=int, default=None, help="fewer layers (smoke tests only)")
    g.add_argument("--preset", default="llama3-8b", help="model shapes (tiny: CPU smoke test)")
    g.add_argument("--device", default="cuda")
    g.add_argument("--policy-map", default=None, help="policy map JSON (default: the map the engine loads on this GPU)")
    g.add_argument("--budget-s", type=float, default=480, help="skip remaining QSPEC e2e runs after this")
    k = sub.add_parser("kernels")
    k.add_argument("--out", required=True)
    k.add_argument("--batches", default="1,8,16,32,64")
    k.add_argument("--gammas", default="2,3,4,5,6")
    k.add_argument("--ctx", type=int, default=64)
    k.add_argument("--layers", type=int, default=None)
    k.add_argument("--policy-map", default=None)
    s = sub.add_parser("smollm2")
    s.add_argument("--out", required=True)
    s.add_argument("--gamma", type=int, default=3)
    s.add_argument("--new", type=int, default=48)
    r = sub.add_parser("report")
    r.add_argument("--gpu", required=True)
    r.add_argument("--smollm2", default=None)
    r.add_argument("--kernels", default=None)
    r.add_argument("--notes", default=None, help="hand-written analysis appended to the Markdown")
    r.add_argument("--md", required=True)
    args = ap.parse_args()
    {"gpu": run_gpu, "kernels": run_kernels, "smollm2": run_smollm2, "report": run_report}[args.stage](args)


if __name__ == "__main__":
    main()
