"""The kernels of a graphed decode step on a timeline, under several switch settings (GPU).

`step_profile.py` profiles eager steps; graphs change how kernels overlap (PDL), and some switches
acted only inside them (stop 37's L2 weight prefetch, `results/weight_prefetch_stop37.patch`).
Here torch.profiler records graph replays of decode steps of a random-weight model at real shapes. Per setting it reports the step's span
(first kernel start to last kernel end), the summed duration of each kernel family, each linear
role's mean duration (the fragment GEMV launches in qkv, o, gate_up, down order), and the idle
time between consecutive kernels.

    python benchmarks/graph_timeline.py --mode w4a16 --batch 4 --set decode_attention=0 --out benchmarks/results

Kernel durations under PDL include the time a kernel spends started but waiting for its predecessor
(griddepcontrol.wait), so family sums overlap; the span and the idle time do not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e import model_for  # noqa: E402
from e2e_ab import parse_switches  # noqa: E402
from step_profile import family  # noqa: E402

ROLES = ["qkv", "o", "gate_up", "down"]


def profile_steps(model, cache, tok, start: int, steps: int, mode: str):
    from torch.profiler import ProfilerActivity, profile

    b = tok.shape[0]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            model(tok, cache, [start + i] * b, [1] * b, mode=mode, logits="last")
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0]
    return sorted(evs, key=lambda e: e.time_range.start)


def summarize(evs, steps: int, layers: int) -> dict:
    lin = [e for e in evs if "_mma_gemv_kernel" in e.name or "_w4a" in e.name]
    roles = {r: [] for r in ROLES}
    for i, e in enumerate(lin[: steps * layers * 4]):
        roles[ROLES[i % 4]].append(e.time_range.elapsed_us())
    fams: dict = {}
    for e in evs:
        f = family(e.name)
        fams[f] = fams.get(f, 0.0) + e.time_range.elapsed_us() / steps
    span = (evs[-1].time_range.end - evs[0].time_range.start) / steps if evs else 0.0
    gaps = [max(0.0, b.time_range.start - a.time_range.end) for a, b in zip(evs, evs[1:])]
    return {"span_us": span, "families_us": fams,
            "linear_us": {r: statistics.mean(v) if v else None for r, v in roles.items()},
            "idle_us_per_step": sum(g for g in gaps if g < 200) / steps, "kernels_per_step": len(evs) / steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--mode", default="w4a16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--int4-prog", action="store_true")
    ap.add_argument("--set", action="append", default=None, help="a switch setting NAME=V[,...]; repeatable "
                    "(the default setting always runs first)")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="")
    a = ap.parse_args()

    from gearshift.kernels import switches

    model = model_for({}, a.preset, a.mode, a.int4_prog)
    model.use_cuda_graphs = True
    layers = model.config.num_hidden_layers
    default = dict(switches.state())
    settings = {"default": {}} | {s: parse_switches(s) for s in (a.set or [])}
    res = {"device": torch.cuda.get_device_name(), "mode": a.mode, "batch": a.batch, "settings": {}}
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (a.batch, a.prompt_len), generator=gen).cuda()
    for name, sw in settings.items():
        switches.set_switches(**(default | sw))
        try:
            cache = model.new_cache(a.batch, a.prompt_len + 3 * a.steps + 8)
            model(prompt, cache, [0] * a.batch, [a.prompt_len] * a.batch, mode=a.mode, logits="last")
            tok = prompt[:, -1:].contiguous()
            for i in range(a.steps):  # captures and warms the step's graphs
                model(tok, cache, [a.prompt_len + i] * a.batch, [1] * a.batch, mode=a.mode, logits="last")
            evs = profile_steps(model, cache, tok, a.prompt_len + a.steps, a.steps, a.mode)
        finally:
            switches.set_switches(**default)
        s = summarize(evs, a.steps, layers)
        res["settings"][name] = s
        print(f"{name}: span {s['span_us']:.0f} us, idle {s['idle_us_per_step']:.0f} us, "
              f"{s['kernels_per_step']:.0f} kernels; linears " +
              " ".join(f"{r} {v:.2f}" for r, v in s["linear_us"].items() if v) + "; " +
              ", ".join(f"{f} {v:.0f}" for f, v in sorted(s["families_us"].items(), key=lambda kv: -kv[1])),
              flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = a.tag if not a.tag or a.tag.startswith("_") else "_" + a.tag
    (out / f"graph_timeline_{res['device'].replace(' ', '_')}_{a.mode}_b{a.batch}{tag}.json").write_text(
        json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
