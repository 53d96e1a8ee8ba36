"""`gearshift generate --policy qspec`: QSPEC options (draft/verify modes, gamma, ablations)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("qspec (--policy qspec)")
    g.add_argument("--draft-mode", default="w4a4",
                   help="QSPEC draft mode: a low-precision activation mode of the same weights (w4a4, w4a8, ...)")
    g.add_argument("--verify-mode", default="w4a16", help="QSPEC verify mode; the output follows this mode")
    g.add_argument("--gamma", type=int, default=3, help="QSPEC draft length (tokens drafted per cycle)")
    g.add_argument("--no-kv-overwrite", dest="kv_overwrite", action="store_false", default=argparse.SUPPRESS,
                   help="ablation: accepted positions keep the draft mode's K/V instead of the verify pass's "
                        "(QSPEC overwrites them by default)")
    g.add_argument("--acceptance", default="auto", choices=["auto", "greedy"],
                   help="auto: top-1 match for temperature 0, Leviathan rejection sampling otherwise; "
                        "greedy: the paper's setting, every request decodes greedily (temperature ignored)")


def modes(args) -> list[str]:
    return [args.draft_mode, args.verify_mode]


def build(args, loaded):
    from gearshift.decode.qspec import QSpecPolicy
    from gearshift.model.loader import note

    calibrated = any(args.draft_mode in lin.act_overrides for _, lin in loaded.model.linear_layers())
    if args.draft_mode == "w4a4" and not calibrated:
        note("the w4a4 draft uses plain per-token int4 activations, which agree with w4a16 on few tokens of small "
             "models (SmolLM2: 7%); output is still exact, but for speed calibrate it (--act-quant g16+o64,down:a8) "
             "or draft with --draft-mode w4a8")

    return QSpecPolicy(loaded.model, draft_mode=args.draft_mode, verify_mode=args.verify_mode, gamma=args.gamma,
                       kv_overwrite=getattr(args, "kv_overwrite", True), acceptance=args.acceptance)
