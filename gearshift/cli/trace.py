"""`gearshift trace`: render GEARBX entropy / gear traces as a PNG (like the paper's Figure 5).

Input: the JSON that ``gearshift generate --policy gearbox --json`` prints (each output's
``stats.gearbox`` holds per-token ``entropy``, ``mean_entropy``, ``gear``, ``wanted_gear`` and
the thresholds), read from a file; or ``--generate ARGS...`` to run that generation first
(ARGS are ``generate`` options, e.g. ``--prompt "..." --max-new-tokens 64``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

from gearshift.cli.common import HelpFormatter
from gearshift.errors import GearshiftError

GEAR_LEVEL = {"low": 0, "mid": 1, "high": 2}
GEAR_COLOR = {"low": "#4caf50", "mid": "#ff9800", "high": "#e53935"}
MAX_PANELS = 8


def _runs(gears: list[str]):
    start = 0
    for i in range(1, len(gears) + 1):
        if i == len(gears) or gears[i] != gears[start]:
            yield gears[start], start, i
            start = i


def render_traces(items: list[tuple[str, dict]], out: str | Path) -> Path:
    """One panel pair per (label, trace): entropy (raw, window mean, thresholds) over tokens,
    shaded by the gear each token was produced in, and the gear step plot below it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    items = [(lab, tr) for lab, tr in items if tr and tr.get("entropy")]
    if not items:
        raise GearshiftError("no gearbox trace to render (run generate with --policy gearbox)")
    items = items[:MAX_PANELS]
    fig, axes = plt.subplots(2 * len(items), 1, figsize=(10, 3.6 * len(items)), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1] * len(items)})
    for k, (label, tr) in enumerate(items):
        ax, axg = axes[2 * k, 0], axes[2 * k + 1, 0]
        h = tr["entropy"]
        mean = tr.get("mean_entropy") or h
        gears = tr.get("gear") or ["high"] * len(h)
        x = list(range(len(h)))
        for g, a, b in _runs(gears):
            ax.axvspan(a - 0.5, b - 0.5, color=GEAR_COLOR.get(g, "#999"), alpha=0.12, lw=0)
        ax.plot(x, h, color="#555", lw=0.8, marker=".", ms=3, label="entropy H_t")
        ax.plot(x, mean, color="#1565c0", lw=2.0, label="window mean")
        if tr.get("theta_low") is not None:
            ax.axhline(tr["theta_low"], color=GEAR_COLOR["low"], ls="--", lw=1, label=f"θ_low {tr['theta_low']:.2f}")
        if tr.get("theta_high") is not None:
            ax.axhline(tr["theta_high"], color=GEAR_COLOR["high"], ls="--", lw=1,
                       label=f"θ_high {tr['theta_high']:.2f}")
        ax.set_ylabel("bits")
        ax.set_xlim(-0.5, len(h) - 0.5)
        extra = f", start {tr.get('initial_gear')}" + (", calibrated" if tr.get("calibrated") else "")
        ax.set_title(f"{label}: entropy and gear ({len(h)} tokens{extra})", fontsize=10)
        handles, _ = ax.get_legend_handles_labels()
        handles += [Patch(color=GEAR_COLOR[g], alpha=0.3, label=g) for g in GEAR_LEVEL]
        ax.legend(handles=handles, fontsize=7, ncol=4, loc="upper right")
        axg.step(x, [GEAR_LEVEL.get(g, 2) for g in gears], where="mid", color="k", lw=1.5, label="gear run")
        wanted = tr.get("wanted_gear")
        if wanted and wanted != gears:
            axg.step(x, [GEAR_LEVEL.get(g, 2) for g in wanted], where="mid", color="#1565c0", lw=1, ls="--",
                     label="gear wanted")
            axg.legend(fontsize=7, loc="upper right")
        axg.set_yticks([0, 1, 2], ["low", "mid", "high"])
        axg.set_ylim(-0.4, 2.4)
        axg.set_xlim(-0.5, len(h) - 0.5)
        axg.set_xlabel("generated token")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def traces_from_json(obj: dict, requests: list[int] | None = None) -> list[tuple[str, dict]]:
    outs = obj.get("outputs")
    if not isinstance(outs, list):
        raise GearshiftError("not a 'gearshift generate --json' output (no 'outputs' list)")
    idx = requests if requests else list(range(len(outs)))
    items = []
    for i in idx:
        if not 0 <= i < len(outs):
            raise GearshiftError(f"--request {i}: the file has {len(outs)} outputs")
        items.append((f"request {i}", (outs[i].get("stats") or {}).get("gearbox", {})))
    return items


def register(sub) -> None:
    p = sub.add_parser("trace", help="render a GEARBX entropy/gear trace as a PNG (paper Figure 5)",
                       description="Render the per-token entropy and gear trace of 'generate --policy gearbox --json' "
                                   "output as a PNG, or run the generation first with --generate ARGS.",
                       formatter_class=HelpFormatter)
    p.add_argument("input", nargs="?", help="JSON file from 'gearshift generate --policy gearbox --json' ('-' = stdin)")
    p.add_argument("--out", default="gearbox_trace.png", help="PNG to write")
    p.add_argument("--request", type=int, action="append", default=None, help="request index to plot (repeatable)")
    p.add_argument("--save-json", default=None, help="with --generate: also save the generation JSON here")
    p.add_argument("--generate", nargs=argparse.REMAINDER, default=None, metavar="ARGS",
                   help="run 'gearshift generate --policy gearbox --json ARGS' and plot its trace (must come last)")
    p.set_defaults(handler=run)


def _run_generation(gen_args: list[str]) -> dict:
    from gearshift.cli import build_parser

    argv = ["generate", "--policy", "gearbox", "--json"] + [a for a in gen_args if a not in ("--json",)]
    args = build_parser().parse_args(argv)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = args.handler(args)
    if rc:
        raise GearshiftError(f"generation failed (exit {rc})")
    return json.loads(buf.getvalue().strip().splitlines()[-1])


def run(args) -> int:
    if args.generate is not None:
        obj = _run_generation(args.generate)
        if args.save_json:
            Path(args.save_json).write_text(json.dumps(obj))
    elif args.input:
        try:
            text = sys.stdin.read() if args.input == "-" else Path(args.input).read_text()
        except OSError as e:
            raise GearshiftError(f"cannot read {args.input}: {e.strerror}") from None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise GearshiftError(f"{args.input} is not JSON: {e}") from None
    else:
        raise GearshiftError("give a JSON file from 'generate --policy gearbox --json' or --generate ARGS")
    out = render_traces(traces_from_json(obj, args.request), args.out)
    print(out)
    return 0
