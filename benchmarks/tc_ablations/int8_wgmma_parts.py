"""Where the int8-wgmma W4A8 kernel's time goes: the same tiles with parts removed (`ablate` bits
of `kernels/w4a8_wgmma._i8_mma_partition`: 1 = no fp32 scale-after, 2 = no weight split
(constant A), 4 = no wgmma). Results are wrong by construction; only the times matter.

Usage on the GPU: PYTHONPATH=. python benchmarks/tc_ablations/int8_wgmma_parts.py [--ncu]
(--ncu: one launch of the full kernel, for `ncu -k regex:w4a8_int8`). Writes $OUT/<tag>.json.
"""
import torch

from gearshift.dispatch.profiler import n_copies, random_store
from gearshift.kernels.act_quant import quantize_act_triton
from gearshift.kernels.w4a8_wgmma import int8_wgmma_codes
from parts_common import ablation_row, parse_parts, parts_parser, save_and_print

ap = parts_parser(__doc__, "1024,4096", "128,128,8,3,0,1;128,64,4,4,168,1", "int8_wgmma_parts")
args, cfgs, shapes, act = parse_parts(ap)
dev = "cuda"
if args.ncu:
    n, k = shapes["qkv"]
    st = random_store("int4", n, k, 128, dev, layout="blocks16")
    x = torch.randn(4096, k, device=dev, dtype=torch.bfloat16)
    codes, scales, sums = quantize_act_triton(x, act, group_sums=128, sums_by_group=True)
    for c in cfgs:
        int8_wgmma_codes(codes, scales, sums, st, c, x.dtype)
    torch.cuda.synchronize()
    raise SystemExit(0)
res = []
for m in [int(v) for v in args.ms.split(",")]:
    for name in ("qkv", "gate_up"):
        n, k = shapes[name]
        st0 = random_store("int4", n, k, 128, dev, layout="blocks16")
        copies = [st0] + [random_store("int4", n, k, 128, dev, layout="blocks16") for _ in range(n_copies(st0) - 1)]
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        codes, scales, sums = quantize_act_triton(x, act, group_sums=128, sums_by_group=True)
        for c in cfgs:
            res.append(ablation_row(m, name, n, k, c, args.ablate, copies,
                                    lambda s, ab, c=c: int8_wgmma_codes(codes, scales, sums, s, c, x.dtype, ablate=ab)))
        del copies, st0
        torch.cuda.empty_cache()
save_and_print(res, args.ablate, args.tag)
