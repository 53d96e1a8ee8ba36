"""A/B two policy maps on whole decode steps: the 128 Llama-3-8B linears of one 32-layer step
(distinct random weights) through the dispatcher under map A and map B, alternating A, B, A, B...
in one process so drift hits both alike; medians per M (GPU). Every choice of both maps is first
checked against the torch reference. Per-shape profiles can disagree with
whole steps (PDL overlaps a kernel's start with its predecessor), so a map change is judged here.

    python benchmarks/policy_ab.py --a gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json --b merged.json \\
        --mode w4a16 --m 1,2,4,8,16 --out benchmarks/results
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import Model, step_fn, time_step, tinygemm_step  # noqa: E402

from gearshift.dispatch.dispatcher import AdaptiveDispatcher  # noqa: E402
from gearshift.dispatch.policy import PolicyMap, device_slug  # noqa: E402
from gearshift.dispatch.profiler import PRESETS  # noqa: E402
from gearshift.kernels.library import to_tinygemm  # noqa: E402
from gearshift.kernels.reference import linear_reference  # noqa: E402
from gearshift.quant.modes import MODES  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--mode", default="w4a16")
    ap.add_argument("--m", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="")
    ap.add_argument("--cublas", action="store_true", help="also time cuBLAS bf16 on dense weights (same run)")
    ap.add_argument("--tinygemm", action="store_true", help="also time torch's int4 kernel on converted copies")
    a = ap.parse_args()
    shapes = PRESETS["llama3-8b"]["shapes"]
    model = Model("int4", shapes, 32, 128, torch.bfloat16)
    act = MODES[a.mode].act
    maps = {"a": AdaptiveDispatcher(PolicyMap.load(a.a), autoload=False),
            "b": AdaptiveDispatcher(PolicyMap.load(a.b), autoload=False)}
    dense = Model("dense", shapes, 32, 0, torch.bfloat16) if a.cublas else None
    tg = [[(to_tinygemm(s), s.group_size) for s in layer] for layer in model.stores] if a.tinygemm else None
    res = {}
    tol = 3e-2 if a.mode == "w4a4" else 5e-3
    for m in (int(v) for v in a.m.split(",")):
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, _, k in shapes]
        for i, store in enumerate(model.stores[0]):  # every choice of both maps against the reference
            ref = linear_reference(xs[i].float(), store, act)
            for name, d in maps.items():
                err = ((d.linear(xs[i], store, act).float() - ref).norm() / ref.norm()).item()
                if not err < tol:
                    raise SystemExit(f"map {name} M={m} shape {shapes[i][0]}: relative error {err:.2e} > {tol}")
        t = {"a": [], "b": []}
        for _ in range(a.rounds):
            for name, d in maps.items():
                t[name].append(time_step(step_fn(model, xs, lambda x, s, d=d: d.linear(x, s, act))))
        res[m] = {name: statistics.median(v) for name, v in t.items()} | {"runs": t}
        line = f"M={m:2}: A {res[m]['a']:.3f} ms  B {res[m]['b']:.3f} ms  B/A {res[m]['b'] / res[m]['a']:.3f}"
        if dense is not None:
            res[m]["cublas_bf16"] = time_step(step_fn(dense, xs, lambda x, s: torch.nn.functional.linear(x, s.weight)))
            line += f"  cuBLAS bf16 {res[m]['cublas_bf16']:.3f} ms"
        if tg is not None:
            res[m]["tinygemm"] = statistics.median(time_step(tinygemm_step(tg, xs)) for _ in range(a.rounds))
            line += f"  tinygemm {res[m]['tinygemm']:.3f} ms"
        print(line, flush=True)
    dev = torch.cuda.get_device_name()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"policy_ab_{device_slug(dev)}{a.tag}.json").write_text(json.dumps(
        {"device": dev, "a": a.a, "b": a.b, "mode": a.mode, "ms": res}, indent=1))


if __name__ == "__main__":
    main()
