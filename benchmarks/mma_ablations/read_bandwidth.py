"""Achievable read bandwidth of the fragment kernel's weight access pattern, with no math (GPU).

Pattern 0 = mma_gemv's (lane (g, t): 16 bytes of rows g and g+8 per 128-column block),
pattern 1 = a warp streaming 512 contiguous bytes of one row. Prints us per call and % of the
copy bandwidth measured in the same run. Usage: PYTHONPATH=. python benchmarks/mma_ablations/read_bandwidth.py
"""
import torch, triton, triton.language as tl
from gearshift.kernels.int4_mma_gemv import WEIGHT_LOADS, _thread_id, _load16
PLAIN: tl.constexpr = WEIGHT_LOADS["plain"]
from gearshift.dispatch.profiler import copy_bandwidth, time_us

@triton.jit
def rd(qw_ptr, out_ptr, N, K, WARPS: tl.constexpr, RPW: tl.constexpr, SPLIT_K: tl.constexpr, PAT: tl.constexpr, U: tl.constexpr):
    pid_n = tl.program_id(0); pid_k = tl.program_id(1)
    tid = _thread_id(tl.zeros([32 * WARPS], dtype=tl.int32))
    lane = tid % 32
    KW = K // 8
    kws = KW // SPLIT_K
    qw32 = qw_ptr.to(tl.pointer_type(tl.int32))
    if PAT == 0:   # mma_gemv: lane (g,t): row 8w+g (+8), words 4t.. of each 16-word block
        row = pid_n * WARPS * RPW + (tid // 32) * RPW + lane // 4
        p = qw32 + row.to(tl.int64) * KW + 4 * (lane % 4)
        step = 16
    else:          # a warp streams 512 contiguous bytes of one row per step
        row = pid_n * WARPS * RPW + (tid // 32) * RPW
        p = qw32 + row.to(tl.int64) * KW + 4 * lane
        step = 128
    acc = tl.zeros([32 * WARPS], dtype=tl.int32)
    for kw0 in range(pid_k * kws, (pid_k + 1) * kws, step * U):
        for u in tl.static_range(U):
            a0, a1, a2, a3 = _load16(p + kw0 + u * step, PLAIN)
            acc ^= a0 ^ a1 ^ a2 ^ a3
            if RPW == 16 and PAT == 0:
                b0, b1, b2, b3 = _load16(p + 8 * KW + kw0 + u * step, PLAIN)
                acc ^= b0 ^ b1 ^ b2 ^ b3
    tl.store(out_ptr + pid_n * 32 * WARPS + tl.arange(0, 32 * WARPS), acc)

dev = "cuda"
bw = copy_bandwidth()
print(f"copy {bw/1e12:.3f} TB/s")
for n, k in ((28672, 4096), (4096, 14336), (4096, 4096)):
    qs = [torch.randint(0, 255, (n, k // 2), dtype=torch.uint8, device=dev) for _ in range(6)]
    out = torch.empty(1 << 20, dtype=torch.int32, device=dev)
    floor = n * k / 2 / bw * 1e6
    for pat, rpw, w, sk, u in [(0, 16, 4, 2, 1), (0, 16, 4, 2, 2), (0, 16, 4, 2, 4), (0, 8, 4, 2, 1), (0, 16, 4, 8, 1), (0, 16, 4, 8, 2),
                               (1, 1, 4, 1, 1), (1, 1, 4, 1, 2), (1, 1, 4, 2, 4), (1, 2, 4, 2, 2), (1, 1, 4, 4, 1)]:
        rows_per_prog = w * (rpw if pat == 0 else rpw)
        if pat == 1:
            rows_per_prog = w * rpw
            if rpw != 1:
                continue
        grid = (n // rows_per_prog, sk)
        if (k // 8) % (sk * (16 if pat == 0 else 128) * u):
            continue
        us = time_us([lambda q=q: rd[grid](q, out, n, k, WARPS=w, RPW=rpw, SPLIT_K=sk, PAT=pat, U=u, num_warps=w) for q in qs])
        print(f"{n}x{k} pat{pat} rpw{rpw} w{w} split{sk} U{u}: {us:6.1f} us  {floor/us*100:5.1f}% of copy bw")
