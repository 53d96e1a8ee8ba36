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

    if advise(loaded.model, args.draft_mode, args.verify_mode, args.gamma) is None:
        group_note(loaded.model, args.draft_mode)
    return QSpecPolicy(loaded.model, draft_mode=args.draft_mode, verify_mode=args.verify_mode, gamma=args.gamma,
                       kv_overwrite=getattr(args, "kv_overwrite", True), acceptance=args.acceptance)


def group_note(model, draft_mode: str) -> None:
    """Where no map can estimate the speed-up: on the GPU, int4 groups under 128 (GGUF Q4_0 / Q4_1) draft on 16-bit
    codes (the int8 MMA kernels need groups of 128), whose steps took 1.01-1.21x W4A16's on Llama-3-8B's shapes and
    1.3-1.5x on SmolLM2's (results/group32_paths.md)."""
    from gearshift.model.loader import note
    from gearshift.quant.int4 import Int4Weight

    groups = [lin.store.group_size for _, lin in model.linear_layers() if isinstance(lin.store, Int4Weight)]
    small = sum(g < 128 for g in groups)
    if model.device.type == "cuda" and groups and 2 * small >= len(groups):
        note(f"{small} of the {len(groups)} int4 linears hold groups under 128 (GGUF Q4_0 / Q4_1: 32), on which "
             f"{draft_mode} cannot use the int8 tensor-core kernels: its step took 1.01-1.21x W4A16's on "
             "Llama-3-8B's shapes and 1.3-1.5x on SmolLM2's (benchmarks/results/group32_paths.md), so expect no "
             "speed-up; quantize a bf16 checkpoint with --quantize int4 (group 128) for QSPEC")


def advise(model, draft_mode: str, verify_mode: str, gamma: int, alpha: float = 0.9) -> dict | None:
    """Say whether speculation can pay on this GPU, from its policy map (DESIGN.md's formula)."""
    from gearshift.decode.qspec import modeled_speedup
    from gearshift.dispatch.policy import load_policy_for_device
    from gearshift.model.loader import note

    pm = load_policy_for_device()  # None without a GPU or a map for it
    if pm is None:
        return None
    est = modeled_speedup(pm, model, draft_mode, verify_mode, gamma, 1, alpha)
    if est is None:
        return None
    verdict = "expect no speed-up" if est["speedup"] < 1 else "speculation can pay"
    borrowed = (" (borrowed: same architecture)" if getattr(pm, "borrowed_for", None) else
                " (with points of the same architecture's map)" if getattr(pm, "filled_from", None) else "")
    whose = f"policy map profiled on {pm.device}{borrowed}"
    note(f"{whose}: a {draft_mode} draft step of the linears costs {est['t_draft_ms']:.2f} ms, "
         f"a {verify_mode} step {est['t_ar_ms']:.2f} ms, verifying {gamma + 1} tokens {est['t_verify_ms']:.2f} ms "
         f"(batch 1); at {alpha:.0%} acceptance QSPEC is modeled at {est['speedup']:.2f}x plain {verify_mode} "
         f"decoding: {verdict}")
    return est
