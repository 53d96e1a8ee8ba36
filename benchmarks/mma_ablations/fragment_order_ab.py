"""The fragment kernel with its inputs in fragment order (no input PRMTs) against the shipped kernel,
on the map's own W4A16 tiles at few tokens (GPU; stop 52).

`sass_loop.py --fragment-order` counts what the variant saves on the CPU: 16 PRMTs per block and token
tile, 151 -> 137 SASS in the one-token gate_up loop. `tests/test_fragment_asm.py` shows its block gives
the shipped block's bits. Stop 52's step ladder put 0.38 ms of the H200's one-token step in the
block's math, so this asks whether fewer instructions pay there. Per M, in one process:
- each shape's map pick, natural inputs against fragment-order ones (the same bits, checked), us;
- the whole 32-layer step of the four linears both ways (CUDA-graph replay, `kernels.step_fn`), ms,
  `--rounds` times alternating.
The inputs are permuted before timing (`to_fragment_order`): no producer writes row inputs in that order,
so what this measures is the upper bound of building one. (The x tiles of 3..16 tokens carry it since stop 65:
`x_tiles_ab.py` times that.)

    PYTHONPATH=. python benchmarks/mma_ablations/fragment_order_ab.py --m 1,2,4,8,16 --out benchmarks/results

Measured (H200, stop 53, `results/h200_stop53.md`): step natural / fragment 1.473 / 1.403 ms at 1 token, 1.474 /
1.418 at 2, 1.472 / 1.510 at 4, 1.503 / 1.439 at 8, 2.191 / 2.293 at 16 (gate_up's pick 11-13% slower at 4 and 16).
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernel_bench import Model, step_fn, tag_suffix, time_step  # noqa: E402  (benchmarks/kernel_bench.py)

from gearshift.dispatch.policy import device_slug, load_map_file  # noqa: E402
from gearshift.dispatch.profiler import PRESETS, copy_bandwidth, n_copies, random_store, time_us  # noqa: E402
from gearshift.kernels import int4_mma_gemv as mg  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--map", default="gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
    ap.add_argument("--m", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("fragment_order_ab.py needs a CUDA GPU")
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    pm = load_map_file(a.map)
    shapes = PRESETS["llama3-8b"]["shapes"]
    bw = copy_bandwidth()
    res = {"device": torch.cuda.get_device_name(), "map": a.map, "dtype": a.dtype, "copy_bw_Bps": bw,
           "shapes": {}, "step_ms": {}}
    picks = {}
    for m in (int(v) for v in a.m.split(",")):
        for name, n, k in shapes:
            c = pm.lookup(f"w4a16:g128:{n}x{k}", m)
            if c.strategy != "w4a16_mma":
                raise SystemExit(f"{name} at M={m}: the map picks {c.strategy}, not the fragment kernel")
            picks[(name, m)] = c.config
            stores = [random_store("int4", n, k, 128, "cuda", dtype, "blocks16")]
            stores += [random_store("int4", n, k, 128, "cuda", dtype, "blocks16") for _ in range(n_copies(stores[0]) - 1)]
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            xf = mg.to_fragment_order(x)
            y = mg.mma_gemv(x, stores[0], c.config)
            if not torch.equal(mg.mma_gemv(xf, stores[0], c.config, fragment_order=True), y):
                raise SystemExit(f"{name} M={m} {c.config.key()}: fragment order gives other bits")
            nat = time_us([lambda s=s: mg.mma_gemv(x, s, c.config) for s in stores])
            frag = time_us([lambda s=s: mg.mma_gemv(xf, s, c.config, fragment_order=True) for s in stores])
            res["shapes"][f"{name}|{m}"] = {"tile": c.config.key(), "natural_us": nat, "fragment_us": frag}
            print(f"{name:8s} M={m:2d} {c.config.key():34s} natural {nat:7.2f} us  fragment {frag:7.2f} us "
                  f"({frag / nat:.3f})", flush=True)
    model = Model("int4", shapes, PRESETS["llama3-8b"]["layers"], 128, dtype, "blocks16")
    res["floor_ms"] = model.nbytes() / bw * 1000
    for m in (int(v) for v in a.m.split(",")):
        xs = [torch.randn(m, k, device="cuda", dtype=dtype) for _, _, k in shapes]
        xfs = [mg.to_fragment_order(x) for x in xs]
        cfg = {id(x): picks[(name, m)] for (name, _, _), x in zip(shapes, xs)}
        cfg |= {id(x): picks[(name, m)] for (name, _, _), x in zip(shapes, xfs)}
        runs = {"natural": step_fn(model, xs, lambda x, s: mg.mma_gemv(x, s, cfg[id(x)])),
                "fragment": step_fn(model, xfs, lambda x, s: mg.mma_gemv(x, s, cfg[id(x)], fragment_order=True))}
        times = {k: [] for k in runs}
        for _ in range(a.rounds):
            for k, run in runs.items():
                times[k].append(time_step(run))
        med = {k: statistics.median(v) for k, v in times.items()}
        res["step_ms"][str(m)] = {"runs": times, **med}
        print(f"M={m:2d} step: natural {med['natural']:.3f} ms ({med['natural'] / res['floor_ms']:.2f}x the floor), "
              f"fragment {med['fragment']:.3f} ms ({med['fragment'] / med['natural']:.3f})", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fragment_order_ab_{device_slug(res['device'])}{tag_suffix(a.tag)}.json"
    path.write_text(json.dumps(res, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
