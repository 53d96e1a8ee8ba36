"""Where a decode step's GPU time goes: kernel durations from torch.profiler, grouped (GPU).

Builds a random-weight model at real shapes, runs the engine eagerly (kernel durations do not
depend on CUDA graphs; the profiler then sees every launch) for a few decode steps, and sums the
GPU time of each kernel family per step. Writes step_profile_<device>.json and prints the table.

    python benchmarks/step_profile.py --mode w4a16 --batch 1 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

FAMILIES = [  # first match wins
    ("linear: fragment MMA (int4)", r"_mma_gemv_kernel"),
    ("linear: other Triton int4/int8", r"_w4a16|_w4a8|_w8|int4_gemv|rowgemv|_dequant"),
    ("activation quantizer", r"_act_quant"),
    ("lm_head / dense GEMM (cuBLAS)", r"gemm|gemv|cutlass|sm90_xmma|nvjet|Kernel2"),
    ("attention (SDPA)", r"flash|fmha|attention|sdpa|softmax"),
    ("RMSNorm / RoPE (Triton)", r"_rmsnorm|_rope"),
    ("KV cache writes / index ops", r"index|scatter|gather|put"),
    ("copies / casts / fills", r"copy|cast|fill|memset|Memcpy|Memset"),
    ("reductions / sampling", r"reduce|argmax|topk|sort|max|sum"),
    ("elementwise (SiLU, residual, masks)", r"elementwise|vectorized|unrolled|silu|mul|add"),
]


def family(name: str) -> str:
    for fam, pat in FAMILIES:
        if re.search(pat, name, re.I):
            return fam
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--mode", default="w4a16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    from gearshift.kernels.pdl import set_pdl

    set_pdl(False)  # with PDL a kernel's duration includes its wait on the previous one: sums would overlap

    from torch.profiler import ProfilerActivity, profile

    from gearshift.decode.autoregressive import AutoregressivePolicy
    from gearshift.decode.sampling import SamplingParams
    from gearshift.engine.engine import Engine, Request
    from gearshift.model.config import ModelConfig
    from gearshift.model.loader import LoadedModel
    from gearshift.model.tiny import build_random_model, preset_config

    cfg = ModelConfig.from_hf_dict(preset_config(args.preset))
    model = build_random_model(args.preset, weights="dense" if args.mode == "w16a16" else "int4", device="cuda")
    model.use_cuda_graphs = False
    loaded = LoadedModel(model, None, cfg, args.preset)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, cfg.vocab_size, (args.prompt_len,), generator=gen).tolist() for _ in range(args.batch)]

    def run(n):
        eng = Engine(loaded, max_batch=args.batch)
        reqs = [Request(p, SamplingParams(max_new_tokens=n, ignore_eos=True)) for p in prompts]
        eng.generate(reqs, AutoregressivePolicy(model, args.mode))
        return eng.last_stats

    run(4)  # compile / warm up
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(1)  # prefill + 1 token
    base = {e.key: (e.device_time_total, e.count) for e in prof.key_averages()}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(1 + args.steps)
    per_kernel, launches = {}, {}
    for e in prof.key_averages():
        us0, n0 = base.get(e.key, (0.0, 0))
        us = e.device_time_total - us0  # subtract the prefill-only run
        if us > 0:
            per_kernel[e.key] = us / args.steps
            launches[e.key] = (e.count - n0) / args.steps
    fams: dict[str, float] = {}
    for k, us in per_kernel.items():
        fams[family(k)] = fams.get(family(k), 0.0) + us
    total = sum(fams.values())
    doc = {"device": torch.cuda.get_device_name(), "preset": args.preset, "mode": args.mode, "batch": args.batch,
           "us_per_step_by_family": fams, "us_per_step_total_gpu": total,
           "launches_per_step": sum(launches.values()),
           "top_kernels_us_per_step": dict(sorted(per_kernel.items(), key=lambda t: -t[1])[:25]),
           "launches_per_step_by_kernel": dict(sorted(launches.items(), key=lambda t: -t[1]))}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"step_profile_{doc['device'].replace(' ', '_')}_{args.mode}_b{args.batch}.json").write_text(
        json.dumps(doc, indent=1))
    print(f"GPU kernel time per decode step ({args.mode}, batch {args.batch}): {total / 1000:.3f} ms "
          f"in {doc['launches_per_step']:.0f} kernel launches")
    for fam, us in sorted(fams.items(), key=lambda t: -t[1]):
        print(f"  {fam:40s} {us / 1000:7.3f} ms  {100 * us / total:5.1f}%")
    print("top kernels:")
    for k, us in list(doc["top_kernels_us_per_step"].items())[:20]:
        print(f"  {us:8.1f} us  {launches[k]:5.0f}x  {k[:100]}")


if __name__ == "__main__":
    main()
