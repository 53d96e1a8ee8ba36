"""What SwiGLU's activation codes cost and save (GPU): per token count, the SwiGLU kernel alone,
SwiGLU emitting the down projection's int8 codes (`silu_mul_codes_triton`, what the engine ran in
W4A8 / W4A4 in stop 30-31), the codes without storing the product (`product=False`, what it runs
since stop 32, where down's kernel takes the codes), and SwiGLU followed by the activation quantizer
(what it ran before).
Llama-3-8B's MLP width (I = 14336), bf16, CUDA-graph replay over enough copies to exceed L2;
the codes are checked bit-identical to the quantizer's first. `silu_mul_codes_only_split` (stop 34): each
row split over 1024-column programs that meet at a barrier. Times are per layer (us), and x 32 per step.

    PYTHONPATH=. python benchmarks/swiglu_codes.py --m 1,16,64,256,1024,4096 --out benchmarks/results
"""
import argparse
import json
from pathlib import Path

import torch

from gearshift.dispatch.profiler import time_us
from gearshift.kernels.act_quant import quantize_act_triton
from gearshift.kernels.silu_mul import silu_mul_codes_triton, silu_mul_triton
from gearshift.quant.activations import ActQuantSpec

INTERMEDIATE = 14336


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", default="1,16,64,256,1024,4096", help="token counts")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="", help="suffix of the result file name")
    ap.add_argument("--warps", type=lambda v: [int(w) for w in v.split(",") if w], default=[],
                    help="also time the codes kernel at these warp counts, e.g. 4,8,32")
    a = ap.parse_args()
    act = ActQuantSpec("int8")
    dev = torch.cuda.get_device_name()
    rows = []
    for m in (int(v) for v in a.m.split(",")):
        copies = max(1, (64 << 20) // (m * 2 * INTERMEDIATE * 2))
        gus = [torch.randn(m, 2 * INTERMEDIATE, device="cuda", dtype=torch.bfloat16) * 3 for _ in range(copies)]
        y, codes = silu_mul_codes_triton(gus[0], 127.0)
        q, sc = quantize_act_triton(silu_mul_triton(gus[0]), act)
        assert torch.equal(codes.codes, q) and torch.equal(codes.scales, sc), m
        _, alone = silu_mul_codes_triton(gus[0], 127.0, product=False, split=False)
        assert torch.equal(alone.codes, q) and torch.equal(alone.scales, sc), m
        _, split = silu_mul_codes_triton(gus[0], 127.0, product=False, split=True)
        assert torch.equal(split.codes, q) and torch.equal(split.scales, sc), m
        t = {"silu_mul": time_us([lambda g=g: silu_mul_triton(g) for g in gus]),
             "silu_mul_codes": time_us([lambda g=g: silu_mul_codes_triton(g, 127.0) for g in gus]),
             "silu_mul_codes_only": time_us([lambda g=g: silu_mul_codes_triton(g, 127.0, product=False, split=False)
                                             for g in gus]),
             "silu_mul_codes_only_split": time_us([lambda g=g: silu_mul_codes_triton(g, 127.0, product=False,
                                                                                     split=True) for g in gus]),
             **{f"silu_mul_codes_w{w}": time_us([lambda g=g, w=w: silu_mul_codes_triton(g, 127.0, warps=w)
                                                 for g in gus]) for w in a.warps},
             "silu_mul_then_quantizer": time_us([lambda g=g: quantize_act_triton(silu_mul_triton(g), act)
                                                 for g in gus])}
        rows.append({"m": m, "us": t})
        print(f"M={m:5}: " + "  ".join(f"{k} {v:6.1f}" for k, v in t.items())
              + f"  | per step (x32) saved "
              f"{(t['silu_mul_then_quantizer'] - t['silu_mul_codes_only']) * 32 / 1000:.3f} ms "
              f"(split: {(t['silu_mul_then_quantizer'] - t['silu_mul_codes_only_split']) * 32 / 1000:.3f})",
              flush=True)
        del gus
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / f"swiglu_codes_{dev.replace(' ', '_')}{a.tag}.json").write_text(
        json.dumps({"device": dev, "intermediate": INTERMEDIATE, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
