"""What the RMSNorm's activation codes cost when the next linear takes only them (GPU): per token
count, the add + RMSNorm kernel alone, with the next linear's int8 codes (what the engine ran in
W4A8 / W4A4 before stop 32), and with the codes only, the normed rows not stored (what it runs
since, where qkv's / gate_up's kernel takes the codes and no hook observes the layer).
Llama-3-8B's hidden size (4096), bf16, CUDA-graph replay over enough copies to exceed L2; the
codes are checked bit-identical first. Times per norm (us); a decoder layer runs two.

    PYTHONPATH=. python benchmarks/norm_codes.py --m 1,16,64,256,1024,4096 --out benchmarks/results
"""
import argparse
import json
from pathlib import Path

import torch

from gearshift.dispatch.profiler import time_us
from gearshift.kernels.rmsnorm import add_rms_norm_codes_triton, add_rms_norm_triton

HIDDEN = 4096


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", default="1,16,64,256,1024,4096", help="token counts")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="", help="suffix of the result file name")
    a = ap.parse_args()
    dev = torch.cuda.get_device_name()
    rows = []
    for m in (int(v) for v in a.m.split(",")):
        copies = max(1, (64 << 20) // (m * HIDDEN * 2 * 2))
        xs = [(torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16),
               torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)) for _ in range(copies)]
        w = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16)
        _, _, codes = add_rms_norm_codes_triton(*xs[0], w, 1e-5, 127.0)
        _, none, alone = add_rms_norm_codes_triton(*xs[0], w, 1e-5, 127.0, normed=False)
        assert none is None and torch.equal(codes.codes, alone.codes) and torch.equal(codes.scales, alone.scales)
        t = {"add_norm": time_us([lambda p=p: add_rms_norm_triton(*p, w, 1e-5) for p in xs]),
             "add_norm_codes": time_us([lambda p=p: add_rms_norm_codes_triton(*p, w, 1e-5, 127.0) for p in xs]),
             "add_norm_codes_only": time_us([lambda p=p: add_rms_norm_codes_triton(*p, w, 1e-5, 127.0, normed=False)
                                             for p in xs])}
        rows.append({"m": m, "us": t})
        print(f"M={m:5}: " + "  ".join(f"{k} {v:6.1f}" for k, v in t.items())
              + f"  | per step (2 norms x 32 layers) saved "
              f"{(t['add_norm_codes'] - t['add_norm_codes_only']) * 64 / 1000:.3f} ms", flush=True)
        del xs
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / f"norm_codes_{dev.replace(' ', '_')}{a.tag}.json").write_text(
        json.dumps({"device": dev, "hidden": HIDDEN, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
