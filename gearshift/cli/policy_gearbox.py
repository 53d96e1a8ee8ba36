"""`gearshift generate --policy gearbox`: GEARBX options (gears, managed layers, monitor, batch rule)."""

from __future__ import annotations

import argparse

from gearshift.decode.entropy import MIN_GEAR_DURATION, WINDOW


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("gearbox (--policy gearbox)")
    g.add_argument("--gears", default="low,mid,high",
                   help="allowed gears (low=int4, mid=int8, high=original weights); a wanted gear that is not "
                        "allowed runs in the next more precise allowed one ('high' pins the unmodified model, "
                        "'low' forces int4)")
    g.add_argument("--manage", default="attention", choices=["attention", "mlp", "attention+mlp"],
                   help="which linear layers change gear (the paper manages the attention projections)")
    g.add_argument("--window", type=int, default=WINDOW, help="entropy rolling-window length (paper: 5)")
    g.add_argument("--min-gear-duration", type=int, default=MIN_GEAR_DURATION,
                   help="tokens a gear serves before another shift")
    g.add_argument("--no-calibrate", dest="calibrate", action="store_false", default=True,
                   help="keep the vocabulary-scaled default thresholds instead of calibrating from prefill logits")
    g.add_argument("--theta-low", type=float, default=None,
                   help="low threshold in bits for the 32K reference vocabulary (scaled; implies --no-calibrate)")
    g.add_argument("--theta-high", type=float, default=None,
                   help="high threshold in bits for the 32K reference vocabulary (scaled; implies --no-calibrate)")
    g.add_argument("--initial-gear", default="auto", choices=["auto", "low", "mid", "high"],
                   help="cold-start gear; auto = the paper's prompt classifier")
    g.add_argument("--batch-gear-rule", default="max", choices=["max", "split"],
                   help="sequences wanting different gears: max = one forward in the highest wanted gear; "
                        "split = one forward per wanted gear (all gears stay resident on the device)")
    g.add_argument("--no-prewarm", dest="prewarm", action="store_false", default=True,
                   help="do not quantize a predicted gear ahead of the shift")
    g.add_argument("--trace-out", default=None, metavar="PNG",
                   help="also render the entropy/gear trace of every request to this PNG (like 'gearshift trace')")


def modes(args) -> list[str]:
    return ["native"]


def build(args, loaded):
    from gearshift.decode.gearbox import GearboxPolicy

    monitor_kwargs = {}
    calibrate = args.calibrate
    if args.theta_low is not None:
        monitor_kwargs["theta_low"] = args.theta_low
        calibrate = False
    if args.theta_high is not None:
        monitor_kwargs["theta_high"] = args.theta_high
        calibrate = False
    texts = None
    try:
        from gearshift.cli.generate import _prompts

        texts = _prompts(args)
    except Exception:  # noqa: BLE001 - the classifier then decodes the prompt tokens
        texts = None
    policy = GearboxPolicy(loaded.model, tokenizer=loaded.tokenizer, prompt_texts=texts, manage=args.manage,
                           gears=args.gears, batch_rule=args.batch_gear_rule, calibrate=calibrate,
                           initial_gear=args.initial_gear, window=args.window,
                           min_gear_duration=args.min_gear_duration, prewarm=args.prewarm,
                           monitor_kwargs=monitor_kwargs)
    if args.trace_out:
        out = args.trace_out

        def render(pol):
            from gearshift.cli.trace import render_traces

            render_traces([(f"request {s.index}", s.stats.get("gearbox", {})) for s in pol.sequences], out)
            pol.counters["trace_png"] = out

        policy.on_finish = render
    return policy
