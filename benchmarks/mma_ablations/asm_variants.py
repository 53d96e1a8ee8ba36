"""The fragment kernel with its MMAs or its activation loads removed from the PTX (GPU timing
only: the outputs of the variants are wrong by construction). Shows which part of the block
costs time. Usage: PYTHONPATH=. python benchmarks/mma_ablations/asm_variants.py
"""
import torch
import gearshift.kernels.int4_mma_gemv as mg
from gearshift.kernels.config import TileConfig
from gearshift.dispatch.profiler import n_copies, random_store, time_us
base = mg.MMA_ASM[("bf16", 16, 1)]
lines = base.split("\n")
variants = {
    "full": base,
    "no_mma": "\n".join(l if not l.startswith("mma.sync") else "add.u32 a0, a0, b0;\nadd.u32 a1, a1, b1;\nadd.u32 a2, a2, a3;" for l in lines).replace("mov.b32 $0, d0;", "mov.b32 $0, a0;").replace("mov.b32 $1, d1;", "mov.b32 $1, a1;").replace("mov.b32 $2, d2;", "mov.b32 $2, a2;"),
    "no_xload": "\n".join(l if not l.startswith("ld.global") else l.split("{")[0].replace("ld.global.v4.b32 ", "") + "" for l in lines if not l.startswith("ld.global")).replace(".reg .b32 x<16>;", ".reg .b32 x<16>;\n" + "\n".join(f"mov.b32 x{i}, $14;" if False else f"cvt.u32.u64 x{i}, $14;" for i in range(16))),
    "one_chain": base,
}
dev = "cuda"
for n, k in ((28672, 4096), (4096, 4096)):
    probe = random_store("int4", n, k, 128, dev)
    stores = [probe] + [random_store("int4", n, k, 128, dev) for _ in range(n_copies(probe) - 1)]
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    for name, asm in variants.items():
        if name == "one_chain":
            continue
        mg.MMA_ASM[("bf16", 16, 1)] = asm
        for sk in ((2, 4) if n > 5000 else (8,)):
            cfg = TileConfig(16, 0, 128, sk, 4, 1)
            try:
                us = time_us([lambda s=s: mg.mma_gemv(x, s, cfg) for s in stores])
                print(f"{n}x{k} {name:10} split{sk}: {us:6.1f} us", flush=True)
            except Exception as e:
                print(name, "failed", str(e)[:300])
    mg.MMA_ASM[("bf16", 16, 1)] = base
