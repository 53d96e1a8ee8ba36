"""Command-line options for calibrated activation quantization (W4A4 / W4A8 drafts).

`add_act_quant_args(parser)` adds the flags; `apply_act_quant(args, loaded)` calibrates (if the
options need data) and installs the quantizers on the loaded model, recording the options in
loaded.info["quantization"]["activations"] so `save_checkpoint` writes them to the manifest.
The `quantize` verb calls it before saving; `generate` calls it after loading (a checkpoint
that already carries calibrated quantizers needs no flags).
"""

from __future__ import annotations

import argparse

from gearshift.errors import GearshiftError


def add_act_quant_args(p: argparse.ArgumentParser, default_modes: str = "w4a4") -> None:
    g = p.add_argument_group("activation quantization (low-precision draft modes)",
                             "Atom-style outlier channels at 8 bits, group-wise scales along K and QuaRot-style "
                             "online Hadamard rotation for w4a4 / w4a8. The int4 weights are never changed.")
    g.add_argument("--act-quant", metavar="SPEC", default=None,
                   help="compact form, '+'-joined: tok | gN (group size) | oN (N outlier channels at 8 bits) | "
                        "had (online Hadamard) | clipF | a4/a8. Example: g32+o32. Overrides the flags below")
    g.add_argument("--act-group-size", type=int, default=None, metavar="N",
                   help="one activation scale per token and group of N input channels (default: per token)")
    g.add_argument("--act-outliers", type=int, default=0, metavar="N",
                   help="outlier channels per linear kept at 8 bits, chosen from calibration activations; "
                        "a multiple of the group size")
    g.add_argument("--act-outlier-metric", default="meansq", choices=["meansq", "absmax"],
                   help="how calibration ranks channels")
    g.add_argument("--act-hadamard", action="store_true",
                   help="online randomised Hadamard rotation Q(xR)R^T before quantizing (weights unchanged)")
    g.add_argument("--act-clip", type=float, default=1.0, metavar="F", help="activation clipping ratio")
    g.add_argument("--act-modes", default=default_modes, metavar="MODES",
                   help="comma-separated modes the options apply to (w4a4, w4a8)")
    g.add_argument("--calibration-prompts", metavar="FILE", default=None,
                   help="calibration prompts: a text file (one per line) or .json/.jsonl; default: built-in")
    g.add_argument("--calibration-tokens", type=int, default=32, metavar="N",
                   help="greedy W4A16 tokens generated after each calibration prompt")


def options_from_args(args):
    from gearshift.engine.calibrate import ActQuantOptions

    if getattr(args, "act_quant", None):
        return ActQuantOptions.parse(args.act_quant)
    return ActQuantOptions(group_size=args.act_group_size, outliers=args.act_outliers,
                           outlier_metric=args.act_outlier_metric, hadamard=args.act_hadamard, clip=args.act_clip)


def act_quant_requested(args) -> bool:
    return bool(getattr(args, "act_quant", None)) or any(
        [getattr(args, "act_group_size", None) is not None, getattr(args, "act_outliers", 0),
         getattr(args, "act_hadamard", False), getattr(args, "act_clip", 1.0) != 1.0])


def read_calibration_prompts(path: str | None) -> list[str] | None:
    if not path:
        return None
    from gearshift.engine.agreement import load_prompts

    return [it.text for it in load_prompts(path)]


def apply_act_quant(args, loaded, progress: bool = True) -> dict:
    """Install the requested activation quantizers; returns {mode: recorded metadata} ({} if none asked)."""
    if not act_quant_requested(args):
        return {}
    from gearshift.engine.calibrate import calibrate_activations, collect_activation_stats
    from gearshift.quant.modes import get_mode

    options = options_from_args(args)
    modes = [m.strip() for m in args.act_modes.split(",") if m.strip()]
    for m in modes:
        if get_mode(m).act is None:
            raise GearshiftError(f"--act-modes: {m} keeps 16-bit activations; use w4a4 and/or w4a8")
    stats = None
    prompts = read_calibration_prompts(getattr(args, "calibration_prompts", None))
    if options.needs_calibration:
        if not prompts:
            from gearshift.data import calibration_prompts

            prompts = calibration_prompts()
        stats = collect_activation_stats(loaded, prompts, new_tokens=args.calibration_tokens, progress=progress)
    out = {}
    for m in modes:
        out[m] = calibrate_activations(loaded, prompts, options, m, progress=progress, stats=stats)
        if options.needs_calibration:
            out[m]["calibration_prompts"] = len(prompts)
    return out
