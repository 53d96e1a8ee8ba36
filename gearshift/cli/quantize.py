"""`gearshift quantize SRC OUT`: write a quantized checkpoint that loads without re-quantizing."""

from __future__ import annotations


from gearshift.cli.common import HelpFormatter
from gearshift.cli.act_options import add_act_quant_args, apply_act_quant
from gearshift.cli.common import DTYPES


def register(sub) -> None:
    p = sub.add_parser("quantize", help="quantize a model and save a gearshift checkpoint",
                       description="Quantize the linear layers of an HF folder or GGUF file (round-to-nearest) and "
                                   "write a checkpoint. Weights a GGUF already holds in an exact int4 form (Q4_0, "
                                   "Q4_1) are kept as they are, never re-quantized.",
                       formatter_class=HelpFormatter)
    p.add_argument("src", help="HF model folder or .gguf file")
    p.add_argument("out", help="output folder (must not exist)")
    p.add_argument("--weights", default="int4", choices=["int4", "int4-sym", "int4-prog", "int8", "none"],
                   help="format for dense linears (int4 = group-wise asymmetric with zero points; int4-prog = "
                        "the same with every group an exact int8 multiple of a per-row power of two, which "
                        "lets W4A8/W4A4 run on the int8 tensor cores without per-group rescaling, at 1-5%% "
                        "more weight error)")
    p.add_argument("--group-size", type=int, default=128, help="int4 group size")
    p.add_argument("--dtype", default="auto", choices=sorted(DTYPES), help="dtype of the dense tensors kept")
    add_act_quant_args(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    from gearshift.model.checkpoint import save_checkpoint
    from gearshift.model.loader import load_model

    how = None if args.weights == "none" else args.weights
    # the dense linears, quantized from their own precision whatever --dtype keeps; a GGUF's int4 ones stay
    loaded = load_model(args.src, dtype=DTYPES[args.dtype], device="cpu", progress=True, group_size=args.group_size,
                        quantize=lambda source, have: how if 16 in have else None)
    n = loaded.info.get("quantized_linears", 0)
    apply_act_quant(args, loaded)  # calibrated activation quantizers (e.g. W4A4 outliers), if asked
    out = save_checkpoint(loaded, args.out)
    print(f"{out}: {n} linears quantized, formats {loaded.weight_summary()}")
    return 0
