"""Read bandwidth from L2 and from DRAM on this GPU, measured by one streaming Triton kernel (GPU).

Why: the skeleton of `w4a8_progressive`'s 256 x 128 tile (TMA stream, barriers and epilogue, no
math; `tc_ablations/progressive_parts.py`, ablate 7) moves 6.3-6.8 TB/s from L2 into shared memory
at M = 4096. Whether that is the L2's ceiling decides whether fewer bytes per multiply-add (TMA
multicast across a cluster) or more math overlap is the next step. This measures the ceiling the
same way: every program reads its own slices of a buffer; a buffer well under the 50 MB L2 is
served from L2 after the first pass, a 2 GB one from DRAM. Each program starts on a different
slice every pass, so no SM rereads its own L1 lines. The sum of everything read is checked against
torch's.

    python benchmarks/l2_bandwidth.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl


@triton.jit
def _stream_read(x_ptr, out_ptr, n_chunks, CHUNK: tl.constexpr, PASSES: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros([BLOCK], tl.int32)
    offs = tl.arange(0, BLOCK)
    for p in range(PASSES):
        for c in range(pid, n_chunks, nprog):
            chunk = (c + p * 7) % n_chunks  # another SM's slice on the next pass
            base = x_ptr + chunk.to(tl.int64) * CHUNK
            for i in range(0, CHUNK, BLOCK):
                acc += tl.load(base + i + offs)
    tl.store(out_ptr + pid * BLOCK + offs, acc)


def measure(nbytes: int, passes: int, programs: int, block: int = 2048, device: str = "cuda") -> dict:
    chunk = max(block, min(16384, nbytes // 4 // (programs * 4)) // block * block)  # >= 4 slices per program
    n = nbytes // 4 // chunk * chunk
    x = torch.randint(-8, 8, (n,), device=device, dtype=torch.int32)
    out = torch.empty(programs * block, device=device, dtype=torch.int32)
    n_chunks = n // chunk

    def run():
        _stream_read[(programs,)](x, out, n_chunks, CHUNK=chunk, PASSES=passes, BLOCK=block, num_warps=8)

    run()
    ok = int(out.to(torch.int64).sum()) == passes * int(x.to(torch.int64).sum())
    if device != "cuda":
        return {"sum_checked": ok}
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    t = sorted(times)[len(times) // 2]
    return {"buffer_MB": n * 4 / 1e6, "passes": passes, "programs": programs, "seconds": t,
            "TBps": passes * n * 4 / t / 1e12, "sum_checked": ok}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for mb, passes in ((4, 400), (8, 200), (16, 100), (24, 64), (32, 50), (2048, 2)):
        for per_sm in (1, 2, 4):
            rows.append(measure(mb << 20, passes, sms * per_sm))
            print(rows[-1], flush=True)
    doc = {"device": torch.cuda.get_device_name(), "sms": sms, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"l2_bandwidth_{doc['device'].replace(' ', '_')}.json").write_text(json.dumps(doc, indent=1))
    print(f"\n{doc['device']}: read bandwidth, TB/s (sums checked: {all(r['sum_checked'] for r in rows)})")
    print("buffer MB | 1 program/SM | 2 | 4")
    for i in range(0, len(rows), 3):
        print(f"{rows[i]['buffer_MB']:.0f} | " + " | ".join(f"{r['TBps']:.2f}" for r in rows[i:i + 3]))


if __name__ == "__main__":
    main()
