"""The fragment kernel with its activation loads a block ahead (`X_LOAD["prefetch"]`) against the
shipped form (loaded at the start of each block's MMAs), on whole decode steps (GPU).

Both forms compute the same sums in the same order, so their outputs must be bit-identical, which
is checked for every shape, mode and M first. Then the 128 Llama-3-8B linears of a 32-layer step
run through the shipped policy map with the switch off and on, alternating, medians per M.

    PYTHONPATH=. python benchmarks/mma_ablations/xprefetch.py --ms 1,2,4,8,16 --out benchmarks/results
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels import Model, step_fn, time_step  # noqa: E402

import gearshift.kernels.int4_mma_gemv as mg  # noqa: E402
from gearshift.dispatch.dispatcher import AdaptiveDispatcher  # noqa: E402
from gearshift.dispatch.policy import PolicyMap, device_slug  # noqa: E402
from gearshift.dispatch.profiler import PRESETS  # noqa: E402
from gearshift.quant.modes import MODES  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="1,2,4,8,16")
    ap.add_argument("--modes", default="w4a16,w4a8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--policy", default=None, help="policy JSON (default: the one shipped for this GPU)")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    shapes = PRESETS["llama3-8b"]["shapes"]
    model = Model("int4", shapes, 32, 128, torch.bfloat16, "blocks16")
    disp = AdaptiveDispatcher(PolicyMap.load(a.policy), autoload=False) if a.policy else AdaptiveDispatcher()
    res = {}
    for mode in a.modes.split(","):
        act = MODES[mode].act
        for m in (int(v) for v in a.ms.split(",")):
            xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, _, k in shapes]
            for i, store in enumerate(model.stores[0]):
                outs = []
                for on in (False, True):
                    mg.X_LOAD["prefetch"] = on
                    outs.append(disp.linear(xs[i], store, act))
                if not torch.equal(*outs):
                    raise SystemExit(f"{mode} M={m} {shapes[i][0]}: prefetched activations change the output")
            t = {"shipped": [], "prefetch": []}
            for _ in range(a.rounds):
                for name, on in (("shipped", False), ("prefetch", True)):
                    mg.X_LOAD["prefetch"] = on
                    t[name].append(time_step(step_fn(model, xs, lambda x, s: disp.linear(x, s, act))))
            mg.X_LOAD["prefetch"] = False
            med = {k: statistics.median(v) for k, v in t.items()}
            res[f"{mode}:{m}"] = med | {"runs": t}
            print(f"{mode} M={m:2}: shipped {med['shipped']:.3f} ms  prefetch {med['prefetch']:.3f} ms  "
                  f"ratio {med['prefetch'] / med['shipped']:.3f}", flush=True)
    dev = torch.cuda.get_device_name()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / f"xprefetch_{device_slug(dev)}.json").write_text(json.dumps({"device": dev, "ms": res}, indent=1))


if __name__ == "__main__":
    main()
