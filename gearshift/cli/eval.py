"""`gearshift eval agreement`: how well a low-precision mode drafts for W4A16 (QSPEC).

Prints, per mode and activation-quantization option, the teacher-forced top-1 agreement with
W4A16 on a prompt set (per tag: chat / math / code) and the expected tokens per QSPEC cycle.
"""

from __future__ import annotations

import json
import sys

from gearshift.cli.common import HelpFormatter
from gearshift.cli.act_options import act_quant_requested, add_act_quant_args, apply_act_quant
from gearshift.cli.common import add_model_args, load_for_modes
from gearshift.errors import GearshiftError


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate the quantized modes (agreement with W4A16, ...)")
    esub = p.add_subparsers(dest="eval_verb", metavar="WHAT")
    a = esub.add_parser(
        "agreement", help="teacher-forced top-1 agreement of draft modes with W4A16 and QSPEC tokens per cycle",
        description="Greedy W4A16 continuations of each prompt are the reference; prompt + continuation go "
                    "through one forward pass per mode and the argmax at each continuation position is compared "
                    "with W4A16's. Expected tokens per QSPEC cycle: (1 - a^(gamma+1)) / (1 - a) (i.i.d. "
                    "acceptance, Leviathan et al. 2023), plus a simulation over the actual match sequences.",
        formatter_class=HelpFormatter)
    add_model_args(a)
    a.add_argument("--prompts", default=None,
                   help="prompt set: a .json/.jsonl file of {text, tag} records or a text file (one prompt per "
                        "line), 'humaneval:N', or the built-in 50 chat/math/code prompts (default)")
    a.add_argument("--tags", default=None, help="only these comma-separated tags (chat, math, code)")
    a.add_argument("--limit", type=int, default=None, help="at most this many prompts")
    a.add_argument("--tokens", type=int, default=64, help="reference continuation length per prompt")
    a.add_argument("--modes", default="w4a8,w4a4", help="comma-separated modes to compare with w4a16")
    a.add_argument("--variants", default=None, metavar="SPECS",
                   help="';'-separated activation options to compare, each applied to every mode, e.g. "
                        "'tok;g32;o32;g32+o32;had+g32' (see --act-quant)")
    a.add_argument("--gamma", type=int, default=3, help="QSPEC draft length")
    a.add_argument("--batch-size", type=int, default=8)
    a.add_argument("--quantize", default="auto", choices=["auto", "none", "int4", "int4-sym", "int4-prog"],
                   help="round-to-nearest int4 for a dense model (int4-prog: int8-exact groups, see "
                        "`gearshift quantize --help`); auto = only if it has no int4 weights")
    a.add_argument("--group-size", type=int, default=128, help="int4 weight group size when quantizing")
    a.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    add_act_quant_args(a, default_modes="w4a4,w4a8")
    a.set_defaults(handler=run_agreement)
    p.set_defaults(handler=lambda args: (p.print_help(), 2)[1])


def run_agreement(args) -> int:
    from gearshift.engine.agreement import AgreementHarness, format_table, load_prompts
    from gearshift.engine.calibrate import (ActQuantOptions, clear_act_quantizers, collect_activation_stats,
                                            install_act_quantizers)
    from gearshift.quant.modes import get_mode

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if get_mode(m).weight_bits != 4:
            raise GearshiftError(f"eval agreement compares int4-weight modes with w4a16; {m} is not one")
    if args.variants and act_quant_requested(args):
        raise GearshiftError("give either --variants or the --act-* options, not both")
    tags = [t.strip() for t in args.tags.split(",")] if args.tags else None
    items = load_prompts(args.prompts, tags, args.limit)
    loaded = load_for_modes(args, ["w4a16"] + modes)
    harness = AgreementHarness(loaded, items, n_tokens=args.tokens, batch_size=args.batch_size)
    rows = []
    if args.variants:
        variants = [ActQuantOptions.parse(v) for v in args.variants.split(";") if v.strip()]
        stats = None
        if any(v.needs_calibration for v in variants):
            from gearshift.cli.act_options import read_calibration_prompts
            from gearshift.data import calibration_prompts

            prompts = read_calibration_prompts(args.calibration_prompts) or calibration_prompts()
            stats = collect_activation_stats(loaded, prompts, new_tokens=args.calibration_tokens)
        for v in variants:
            for m in modes:
                clear_act_quantizers(loaded, m)
                install_act_quantizers(loaded, v, m, stats)
                rows.append(harness.evaluate(m, v.describe(), args.gamma))
                _progress_line(rows[-1], args)
    else:
        applied = apply_act_quant(args, loaded)
        recorded = loaded.info.get("quantization", {}).get("activations", {})
        for m in modes:
            if m in applied or m in recorded:
                desc = (applied.get(m) or recorded.get(m) or {}).get("spec", "calibrated")
            else:
                desc = "default " + get_mode(m).act.describe()
            rows.append(harness.evaluate(m, desc, args.gamma))
    if args.json:
        print(json.dumps({"model": loaded.source, "prompts": len(harness.items), "tokens": args.tokens,
                          "gamma": args.gamma, "self_consistency": round(harness.self_consistency, 4),
                          "rows": [r.to_dict(args.gamma) for r in rows]}, indent=2))
    else:
        print(f"{loaded.source}: {len(harness.items)} prompts ({', '.join(harness.tags)}), "
              f"{sum(len(c) for c in harness.conts)} reference tokens; w4a16 self-consistency "
              f"{harness.self_consistency:.3f}")
        print(format_table(rows, args.gamma))
    return 0


def _progress_line(row, args) -> None:
    if not args.json:
        print(f"  {row.label}: agreement {row.alpha('all'):.3f}", file=sys.stderr)
