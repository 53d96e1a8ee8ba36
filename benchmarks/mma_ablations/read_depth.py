"""How fast the Llama-3-8B linears' int4 weight bytes can be read on this GPU with no math, by how
the bytes are put in flight, against the dispatched W4A16 kernel on the same shapes (GPU).

Stop 31 found the fragment kernel streams gate_up at ~2.4 TB/s on both the H100 (copy 2.95 TB/s)
and the H200 (copy 4.20), and read that as a limit on the bytes an SM keeps in flight. This asks
what each way of putting bytes in flight reaches on the GPU at hand:
- regs: W warps per CTA, each CTA streaming CHUNK contiguous words, U 16-byte loads (ld.global.v4)
  per thread and step in the PTX. In the sm_90 SASS ptxas keeps about 7 such loads per thread in
  flight whatever U is (nvdisasm of the cubin, stop 52), so the JSON's `cta_bytes_in_flight` of these
  rows (512 * W * U) counts the PTX's loads per step, not what is in flight;
- tma:  Triton's pipelined tensor-descriptor loads, a ring of S stages of [BR, BC]-word boxes in
  shared memory per CTA (KSPLIT CTAs share a row block's K).
Times are CUDA-graph medians over enough weight copies that L2 holds none of them (`time_us`), as the
profiler times kernels. Prints one line per shape and writes JSON.

    PYTHONPATH=. python benchmarks/mma_ablations/read_depth.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from gearshift.dispatch.policy import device_slug
from gearshift.dispatch.profiler import PRESETS, copy_bandwidth, n_copies, random_store, time_us


@triton.jit
def regs_read(w_ptr, out_ptr, CHUNK: tl.constexpr, W: tl.constexpr, U: tl.constexpr):
    """Program p xors words [p * CHUNK, (p + 1) * CHUNK) of w, U x 4 contiguous words per thread and step."""
    pid = tl.program_id(0)
    row = tl.arange(0, 128 * W)
    offs = tl.arange(0, U)[:, None] * (128 * W) + row[None, :]
    p = w_ptr + pid.to(tl.int64) * CHUNK + offs
    acc = tl.zeros([128 * W], dtype=tl.int32)
    for s in range(0, CHUNK, 128 * W * U):
        acc ^= tl.xor_sum(tl.load(p + s), axis=0)
    tl.store(out_ptr + pid * 128 * W + row, acc)


@triton.jit
def tma_read(desc, out_ptr, C, BR: tl.constexpr, BC: tl.constexpr, KSPLIT: tl.constexpr,
             STAGES: tl.constexpr):
    """Row block pid_r's [BR, C / KSPLIT] slice pid_k, one [BR, BC] box per pipelined TMA load."""
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    per = C // KSPLIT
    acc = tl.zeros([BR, BC], dtype=tl.int32)
    for c in tl.range(pid_k * per, (pid_k + 1) * per, BC, num_stages=STAGES):
        acc ^= desc.load([pid_r * BR, c])
    rows = pid_r * BR + tl.arange(0, BR)
    tl.store(out_ptr + rows * KSPLIT + pid_k, tl.xor_sum(acc, axis=1))


def regs_reference(w: torch.Tensor, chunk: int, warps: int) -> torch.Tensor:
    """`regs_read`'s output in torch: each chunk's [steps, 128 * W] words XOR-ed over its steps."""
    v = w.reshape(-1, chunk // (128 * warps), 128 * warps)
    acc = v[:, 0].clone()
    for i in range(1, v.shape[1]):
        acc ^= v[:, i]
    return acc.reshape(-1)


def tma_reference(w: torch.Tensor, ksplit: int) -> torch.Tensor:
    """`tma_read`'s output in torch: [rows, KSPLIT], each row slice's words XOR-ed."""
    v = w.reshape(w.shape[0], ksplit, -1)
    acc = v[..., 0].clone()
    for i in range(1, v.shape[-1]):
        acc ^= v[..., i]
    return acc


def regs_configs():
    for w, u, chunk in itertools.product((4, 8), (1, 2, 4, 8), (1 << 14, 1 << 16)):
        if chunk % (128 * w * u) == 0:
            yield {"W": w, "U": u, "CHUNK": chunk}


def tma_configs():
    for br, bc, s, ks in itertools.product((32, 64, 128), (64, 128), (2, 4, 6), (1, 2, 4)):
        if br * bc * 4 * s <= 200 * 1024:
            yield {"BR": br, "BC": bc, "STAGES": s, "KSPLIT": ks}


def dispatched_us(d, n: int, k: int, m: int, dev: str) -> tuple[float, str]:
    """Dispatcher d's W4A16 pick at (n, k, m) on blocks16 stores, as the engine runs it."""
    probe = random_store("int4", n, k, 128, dev, layout="blocks16")
    stores = [random_store("int4", n, k, 128, dev, layout="blocks16") for _ in range(n_copies(probe))]
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    strat, c = d.kernel_for(stores[0], None, m)
    return time_us([lambda s=s: d.linear(x, s, None) for s in stores]), f"{strat.name}:{c.config.key()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results", help="folder for read_depth_<device>.json")
    ap.add_argument("--m", default="1,8", help="token counts of the dispatched W4A16 rows")
    ap.add_argument("--tag", default="", help="suffix of the JSON file's name")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("read_depth.py needs a CUDA GPU")
    from triton.tools.tensor_descriptor import TensorDescriptor

    from gearshift.dispatch.dispatcher import install_policy
    disp = install_policy()  # the map the engine runs on this GPU

    dev = "cuda"
    bw = copy_bandwidth()
    name = torch.cuda.get_device_name()
    res = {"device": name, "triton": triton.__version__, "copy_bw_Bps": bw, "shapes": {}}
    print(f"{name}: copy {bw / 1e12:.3f} TB/s (read + write)")
    for sname, n, k in PRESETS["llama3-8b"]["shapes"]:
        nbytes = n * k // 2
        copies = n_copies(random_store("int4", n, k, 128, dev))
        ws = [torch.randint(-2 ** 31, 2 ** 31 - 1, (n, k // 8), dtype=torch.int32, device=dev) for _ in range(copies)]
        out = torch.empty(1 << 22, dtype=torch.int32, device=dev)
        rows = []
        for c in regs_configs():
            grid = (ws[0].numel() // c["CHUNK"],)
            us = time_us([lambda w=w: regs_read[grid](w, out, num_warps=c["W"], **c) for w in ws])
            rows.append({"way": "regs", **c, "ctas": grid[0], "cta_bytes_in_flight": 512 * c["W"] * c["U"],
                         "us": us, "TBps": nbytes / us / 1e6})
        for c in tma_configs():
            if (k // 8) % (c["BC"] * c["KSPLIT"]) or n % c["BR"]:
                continue
            descs = [TensorDescriptor.from_tensor(w, block_shape=[c["BR"], c["BC"]]) for w in ws]
            grid = (n // c["BR"], c["KSPLIT"])
            try:
                us = time_us([lambda d=d: tma_read[grid](d, out, k // 8, num_warps=4, **c) for d in descs])
            except Exception as e:  # noqa: BLE001 - an illegal box or too much shared memory: say which
                rows.append({"way": "tma", **c, "error": f"{type(e).__name__}: {str(e)[:120]}"})
                continue
            rows.append({"way": "tma", **c, "ctas": grid[0] * grid[1],
                         "cta_bytes_in_flight": c["BR"] * c["BC"] * 4 * (c["STAGES"] - 1),
                         "us": us, "TBps": nbytes / us / 1e6})
        disp = {}
        for m in [int(v) for v in args.m.split(",")]:
            us, pick = dispatched_us(disp, n, k, m, dev)
            disp[m] = {"us": us, "pick": pick, "TBps": nbytes / us / 1e6}
        res["shapes"][sname] = {"n": n, "k": k, "bytes": nbytes, "reads": rows, "dispatched_w4a16": disp}
        ok = [r for r in rows if "us" in r]
        best = {way: min((r for r in ok if r["way"] == way), key=lambda r: r["us"]) for way in ("regs", "tma")}
        line = "  ".join(f"{way} {b['us']:6.1f} us {b['TBps']:.2f} TB/s "
                         f"({','.join(f'{key}{b[key]}' for key in b if key.isupper())})" for way, b in best.items())
        dl = "  ".join(f"W4A16 M={m} {v['us']:6.1f} us {v['TBps']:.2f} TB/s" for m, v in disp.items())
        print(f"{sname:8s} {nbytes / 1e6:5.1f} MB  {line}  |  {dl}", flush=True)
    path = Path(args.out) / f"read_depth_{device_slug(name)}{args.tag}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
