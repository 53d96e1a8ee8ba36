"""Where `w4a8_progressive`'s time goes: the same tiles with parts removed (`ablate` bits of
`kernels/w4a8_progressive._mma_partition`: 1 = no scale / min pick, 2 = no weight build (constant
A), 4 = no wgmma; 7 leaves the TMA stream, barriers and epilogue). Results are wrong by
construction; only the times matter. Stop 20's best tile reached 55% of the int8 peak at M = 4096
with no spills in its loop; this says which part the rest is.

Usage on the GPU: PYTHONPATH=. python benchmarks/tc_ablations/progressive_parts.py [--ncu]
(--ncu: one launch of each full tile per M and shape, for `ncu --clock-control none -k regex:w4a8_progressive`).
Writes $OUT/<tag>.json and prints a table last.
"""
import torch

from gearshift.dispatch.profiler import n_copies, random_store
from gearshift.kernels.act_quant import quantize_act_triton
from gearshift.kernels.w4a8_progressive import progressive_codes
from parts_common import ablation_row, parse_parts, parts_parser, save_and_print

ap = parts_parser(__doc__, "256,4096", "256,128,8,3,0,1;128,128,8,4,0,1;128,64,4,4,0,1", "progressive_parts")
ap.add_argument("--shapes", default="qkv,gate_up")
args, cfgs, shapes, act = parse_parts(ap)
dev = "cuda"
if args.ncu:  # one launch of each full tile per M and shape, in that order
    for m in [int(v) for v in args.ms.split(",")]:
        for name in args.shapes.split(","):
            n, k = shapes[name]
            st = random_store("int4p", n, k, 128, dev, layout="blocks16")
            codes, scales = quantize_act_triton(torch.randn(m, k, device=dev, dtype=torch.bfloat16), act)
            for c in cfgs:
                progressive_codes(codes, scales, st, c, torch.bfloat16)
    torch.cuda.synchronize()
    raise SystemExit(0)
res = []
for m in [int(v) for v in args.ms.split(",")]:
    for name in args.shapes.split(","):
        n, k = shapes[name]
        st0 = random_store("int4p", n, k, 128, dev, layout="blocks16")
        copies = [st0] + [random_store("int4p", n, k, 128, dev, layout="blocks16") for _ in range(n_copies(st0) - 1)]
        codes, scales = quantize_act_triton(torch.randn(m, k, device=dev, dtype=torch.bfloat16), act)
        for c in cfgs:
            if c.bm > max(64, m):
                continue
            res.append(ablation_row(m, name, n, k, c, args.ablate, copies,
                                    lambda s, ab, c=c: progressive_codes(codes, scales, s, c, torch.bfloat16, ab)))
        del copies, st0
        torch.cuda.empty_cache()
save_and_print(res, args.ablate, args.tag)
