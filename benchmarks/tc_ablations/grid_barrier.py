"""What a decode megakernel could save at one token (GPU; stop 32).

A chain of dependent weight-streaming phases with the byte sizes of the int4 linears of a
Llama-3-8B decode step (qkv, o, gate_up, down; 32 layers: 128 phases), each phase's programs
reading the previous phase's output before they write their own, run two ways:

- `launches`: one kernel launch per phase, as the engine runs its linears: programmatic dependent
  launch, each program loading its first weight block before `griddepcontrol.wait`;
- `persistent`: one launch whose programs (one or two per SM, all resident) run every phase, the
  phases meeting at grid-wide barriers (an acq_rel counter; a program spins until every program has
  finished the previous phase), each program loading its first weight block of a phase before it
  waits at that phase's barrier.

The streaming loop is the same plain Triton loop in both (not the fragment kernel: no MMAs, no
dequantization), so the difference between the two is what the launches cost against what the
barriers cost. Both are timed as CUDA-graph replays against the bytes at the copy bandwidth
measured in the same run. Each program's result is checked against torch.

    PYTHONPATH=. python benchmarks/tc_ablations/grid_barrier.py --out benchmarks/results
"""
import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from gearshift.dispatch.profiler import PRESETS, time_us
from gearshift.kernels.pdl import grid_wait, launch_dependents, launch_kwargs

BLOCK = 2048  # int32 words per load step of a program (8 KB)


@triton.jit
def _chunk_sum(w_ptr, base, first, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    """The sum of one program's chunk (STEPS blocks from base), its first block already loaded."""
    offs = tl.arange(0, BLOCK)
    acc = first
    for i in range(1, STEPS):
        acc += tl.load(w_ptr + base + i * BLOCK + offs, cache_modifier=".cg")
    return tl.sum(acc, 0)


@triton.jit
def _phase_kernel(w_ptr, x_ptr, nx, y_ptr, v_ptr, BLOCK: tl.constexpr, STEPS: tl.constexpr, PDL: tl.constexpr,
                  XWORDS: tl.constexpr):
    pid = tl.program_id(0)
    launch_dependents(PDL)
    base = pid.to(tl.int64) * (BLOCK * STEPS)
    first = tl.load(w_ptr + base + tl.arange(0, BLOCK), cache_modifier=".cg")  # weights: no dependency
    grid_wait(PDL)
    x = tl.load(x_ptr + pid % nx)  # the previous phase's output
    if XWORDS > 0:  # an activation vector read after the wait, as a GEMV reads its input
        first += tl.sum(tl.load(v_ptr + tl.arange(0, XWORDS) + x * 0), 0)
    tl.store(y_ptr + pid, _chunk_sum(w_ptr, base, first, BLOCK, STEPS) + x)


@triton.jit
def _persistent_kernel(w_ptr, offs_ptr, chunks_ptr, out_offs_ptr, y_ptr, cnt_ptr, n_phases,
                       BLOCK: tl.constexpr, STEPS: tl.constexpr):
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    lane = tl.arange(0, BLOCK)
    for ph in range(n_phases):
        w0 = tl.load(offs_ptr + ph)
        n_ch = tl.load(chunks_ptr + ph)
        o_prev = tl.load(out_offs_ptr + tl.maximum(ph - 1, 0))
        n_prev = tl.load(chunks_ptr + tl.maximum(ph - 1, 0))
        o_here = tl.load(out_offs_ptr + ph)
        c = pid
        first = tl.load(w_ptr + w0 + c.to(tl.int64) * (BLOCK * STEPS) + lane, mask=(lane >= 0) & (c < n_ch),
                        other=0, cache_modifier=".cg")  # before the barrier: weights only
        if ph > 0:  # every program has finished phase ph - 1
            while tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu") < ph * progs:
                pass
            tl.debug_barrier()  # (the whole program past the acquire before its loads)
        while c < n_ch:
            base = w0 + c.to(tl.int64) * (BLOCK * STEPS)
            x = tl.load(y_ptr + o_prev + c % n_prev, mask=ph > 0, other=0, cache_modifier=".cg")
            tl.store(y_ptr + o_here + c, _chunk_sum(w_ptr, base, first, BLOCK, STEPS) + x)
            c += progs
            first = tl.load(w_ptr + w0 + c.to(tl.int64) * (BLOCK * STEPS) + lane, mask=(lane >= 0) & (c < n_ch),
                            other=0, cache_modifier=".cg")
        tl.debug_barrier()  # every store of the program before the release
        tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--per-sm", default="1,2", help="programs per SM of the persistent launch")
    ap.add_argument("--chunk-kb", default="64", help="bytes per program and phase, KB (multiples of 8)")
    ap.add_argument("--x-kb", default="0", help="also read an activation vector of this many KB after the wait "
                    "(0: only the previous phase's scalar; launches only)")
    a = ap.parse_args()
    rows = []
    for ckb in (int(v) for v in a.chunk_kb.split(",")):
        for xkb in (int(v) for v in a.x_kb.split(",")):
            rows.append(run(a, ckb * 256, xkb * 256, persistent_too=xkb == 0))
    dev = torch.cuda.get_device_name()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / f"grid_barrier_{dev.replace(' ', '_')}.json").write_text(json.dumps(rows, indent=1))


def run(a, CHUNK: int, xwords: int, persistent_too: bool) -> dict:
    dev = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = PRESETS["llama3-8b"]["shapes"]
    chunks = [-(-(n * k // 8) // CHUNK) for _, n, k in shapes] * a.layers  # int4: 8 codes per word
    offs = [0]
    for c in chunks[:-1]:
        offs.append(offs[-1] + c * CHUNK)
    words = (offs[-1] + chunks[-1] * CHUNK)
    w = torch.randint(-8, 8, (words,), device="cuda", dtype=torch.int32)
    out_offs = [0]
    for c in chunks[:-1]:
        out_offs.append(out_offs[-1] + c)
    y = torch.zeros(out_offs[-1] + chunks[-1], device="cuda", dtype=torch.int32)
    steps = CHUNK // BLOCK

    # the reference: each chunk's sum plus the previous phase's output at chunk % n_prev
    sums = w.view(-1, CHUNK).sum(1, dtype=torch.int32)
    ref = torch.empty_like(y)
    for ph, (o, c) in enumerate(zip(out_offs, chunks)):
        s = sums[offs[ph] // CHUNK: offs[ph] // CHUNK + c]
        if ph:
            prev = ref[out_offs[ph - 1]: out_offs[ph - 1] + chunks[ph - 1]]
            s = s + prev[torch.arange(c, device="cuda") % chunks[ph - 1]]
        ref[o: o + c] = s

    v = torch.zeros(max(xwords, 1), device="cuda", dtype=torch.int32)

    def launches():
        x = torch.zeros(1, device="cuda", dtype=torch.int32)
        nx = 1
        for ph, c in enumerate(chunks):
            yo = y[out_offs[ph]: out_offs[ph] + c]
            _phase_kernel[(c,)](w[offs[ph]:], x, nx, yo, v, BLOCK=BLOCK, STEPS=steps, PDL=True, XWORDS=xwords,
                                num_warps=8, **launch_kwargs(True))
            x, nx = yo, c

    offs_t = torch.tensor(offs, device="cuda", dtype=torch.int64)
    chunks_t = torch.tensor(chunks, device="cuda", dtype=torch.int32)
    out_offs_t = torch.tensor(out_offs, device="cuda", dtype=torch.int32)
    cnt = torch.zeros(1, device="cuda", dtype=torch.int32)

    def persistent(per_sm):
        def run():
            cnt.zero_()
            _persistent_kernel[(sms * per_sm,)](w, offs_t, chunks_t, out_offs_t, y, cnt, len(chunks), BLOCK=BLOCK,
                                                STEPS=steps, num_warps=8)
        return run

    res = {"device": dev, "layers": a.layers, "bytes": words * 4, "phases": len(chunks), "chunk_bytes": CHUNK * 4,
           "x_bytes": xwords * 4}
    src = torch.empty(1 << 28, device="cuda", dtype=torch.int32)
    dst = torch.empty_like(src)
    res["copy_tbs"] = 2 * src.numel() * 4 / time_us([lambda: dst.copy_(src)]) / 1e6
    floor_us = words * 4 / (res["copy_tbs"] * 1e6)
    res["floor_us"] = floor_us
    y.zero_()
    launches()
    torch.cuda.synchronize()
    res["launches_ok"] = bool(torch.equal(y, ref))
    res["launches_us"] = time_us([launches], rounds=3)
    per_sm = [int(v) for v in a.per_sm.split(",")] if persistent_too else []
    for p in per_sm:
        y.zero_()
        persistent(p)()
        torch.cuda.synchronize()
        res[f"persistent{p}_ok"] = bool(torch.equal(y, ref))
        res[f"persistent{p}_us"] = time_us([persistent(p)], rounds=3)
    print(f"chunk {CHUNK * 4 // 1024} KB, x {xwords * 4 // 1024} KB: {len(chunks)} phases, {words * 4 / 1e9:.2f} GB "
          f"({'ok' if res['launches_ok'] else 'WRONG'}): copy-rate time {floor_us / 1e3:.3f} ms; one launch per phase "
          f"{res['launches_us'] / 1e3:.3f} ms ({words * 4 / res['launches_us'] / 1e6:.2f} TB/s)"
          + "".join(f"; persistent, {p} per SM {res[f'persistent{p}_us'] / 1e3:.3f} ms" for p in per_sm), flush=True)
    return res


if __name__ == "__main__":
    main()
