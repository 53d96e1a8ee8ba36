"""`gearshift generate`: text generation with a decode policy (ar, qspec, gearbox)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from gearshift.cli.act_options import add_act_quant_args, apply_act_quant
from gearshift.cli.common import DEFAULT_MAX_MODEL_LEN, HelpFormatter, add_model_args, load_for_modes
from gearshift.errors import GearshiftError

#: policy name -> module providing add_arguments(parser), modes(args) and build(args, loaded)
POLICY_MODULES = {"ar": "gearshift.cli.generate", "qspec": "gearshift.cli.policy_qspec",
                  "gearbox": "gearshift.cli.policy_gearbox"}


def policy_module(name: str):
    try:
        return importlib.import_module(POLICY_MODULES[name])
    except KeyError:
        raise GearshiftError(f"unknown policy {name!r}; choose one of {', '.join(available_policies())}") from None


def available_policies() -> list[str]:
    out = []
    for name, mod in POLICY_MODULES.items():
        try:
            importlib.import_module(mod)
            out.append(name)
        except ModuleNotFoundError:
            pass
    return out


# the "ar" policy's hooks live here
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", default="w4a16",
                   help="precision mode for --policy ar: w16a16, w8a16, w8a8, w4a16, w4a8, w4a8fp8, w4a4 "
                        "(default: w4a16)")


def modes(args) -> list[str]:
    return [args.mode]


def build(args, loaded):
    from gearshift.decode.autoregressive import AutoregressivePolicy

    return AutoregressivePolicy(loaded.model, args.mode)


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text from one or more prompts",
                       description="Generate text. Prompts are wrapped in the model's chat template when it has\n"
                                   "one (use --no-chat for raw completion). Output streams to the terminal for one\n"
                                   "prompt; --json prints one machine-readable object instead; -i holds a\n"
                                   "conversation in the terminal.",
                       formatter_class=HelpFormatter)
    add_model_args(p)
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for a batch)")
    p.add_argument("--prompt-file", help="file with one prompt per line")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate per prompt (default: 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    p.add_argument("--min-p", type=float, default=0.0, help="0 = off")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling (each prompt gets this seed; default: random)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 1 discourages every token already in the prompt or output (llama.cpp's --repeat-penalty, "
                        "HF's repetition_penalty); 1 = off. Penalties need --policy ar")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtracted from a token's logit per earlier occurrence in the output, -2..2 (OpenAI's); "
                        "0 = off")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtracted once from the logit of a token the output holds, -2..2 (OpenAI's); 0 = off")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")
    chat = p.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None, help="force the chat template")
    chat.add_argument("--no-chat", dest="chat", action="store_false", help="raw completion, no chat template")
    p.add_argument("--system", default=None, help="system message for the chat template")
    p.add_argument("-i", "--interactive", action="store_true",
                   help="a conversation in the terminal: type a turn, the reply streams; /reset, /exit "
                        "(--prompt, if given, is the first turn)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences decoded together; more prompts join as slots free up (default: 8)")
    p.add_argument("--json", action="store_true",
                   help='print one JSON object {"outputs": [{"text", "token_ids", ...}], "stats": {...}}')
    add_decode_args(p)
    p.set_defaults(handler=run)


def add_decode_args(p: argparse.ArgumentParser, policies: bool = False) -> None:
    """--policy, --quantize, --act-quant and every policy's options (--mode, --draft-mode, ...): shared by
    generate, serve and bench (`policies`: --policy takes a comma-separated list)."""
    what = ("decode policy: ar (autoregressive), qspec (draft low-precision, verify w4a16), gearbox "
            "(entropy-routed gears)")
    if policies:
        p.add_argument("--policy", default=["ar", "qspec"], type=_policy_list, metavar="P[,P...]",
                       help=f"{what}; comma-separated, each run in turn (default: ar,qspec)")
    else:
        p.add_argument("--policy", default="ar", choices=list(POLICY_MODULES), help=f"{what} (default: ar)")
    p.add_argument("--quantize", default="auto", choices=["auto", "none", "int4", "int4-sym", "int4-prog", "int8"],
                   help="round-to-nearest quantization of a dense model's linears (int4-prog: int8-exact "
                        "groups, see `gearshift quantize --help`), from the weights' own precision as `gearshift quantize` "
                        "does; auto = only if the mode needs it")
    p.add_argument("--group-size", type=int, default=128, help="int4 group size when quantizing (default: 128)")
    add_act_quant_args(p)
    for name in available_policies():
        if name != "ar":
            policy_module(name).add_arguments(p)
    add_arguments(p)


def load_for_policies(args, modules: list, extra_modes: list[str] = ()):
    """--model loaded for the modes of these policy modules and `extra_modes` (all checked before anything
    loads), with the asked activation quantizers installed."""
    from gearshift.quant.modes import get_mode

    modes = list(dict.fromkeys([m for mod in modules for m in mod.modes(args)] + list(extra_modes)))
    for m in modes:
        get_mode(m)  # fail fast on an unknown mode, before loading anything
    loaded = load_for_modes(args, modes)
    apply_act_quant(args, loaded)
    return loaded


def _policy_list(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in POLICY_MODULES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown policy {', '.join(unknown) or repr(text)}; choose from "
                                         f"{', '.join(POLICY_MODULES)}")
    return list(dict.fromkeys(names))


def _prompts(args) -> list[str]:
    prompts = list(args.prompt)
    if args.prompt_file:
        try:
            with open(args.prompt_file, encoding="utf-8") as fh:
                prompts += [line.rstrip("\n") for line in fh if line.strip()]
        except OSError as e:
            raise GearshiftError(f"cannot read --prompt-file: {e.strerror}: {args.prompt_file}") from None
    if not prompts:
        raise GearshiftError("no prompt given; pass --prompt TEXT (repeatable) or --prompt-file FILE")
    return prompts


def run(args) -> int:
    from gearshift.decode.sampling import SamplingParams
    from gearshift.engine.engine import Engine, Request

    prompts = [] if args.interactive and not (args.prompt or args.prompt_file) else _prompts(args)
    if args.interactive and args.json:
        raise GearshiftError("--interactive writes text as it decodes; it cannot be combined with --json")
    if args.interactive and getattr(args, "trace_out", None):
        raise GearshiftError("--trace-out renders the requests of one run; it does not combine with --interactive")
    if args.batch_size < 1:
        raise GearshiftError("--batch-size must be >= 1")
    pol = policy_module(args.policy)

    def sampling():
        return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                              seed=args.seed, max_new_tokens=args.max_new_tokens, stop=list(args.stop),
                              ignore_eos=args.ignore_eos, repetition_penalty=args.repetition_penalty,
                              frequency_penalty=args.frequency_penalty, presence_penalty=args.presence_penalty)

    if sampling().penalized and args.policy != "ar":  # (and the ranges checked) before a model loads
        raise GearshiftError(f"repetition / frequency / presence penalties need --policy ar; {args.policy} samples "
                             "without them")
    loaded = load_for_policies(args, [pol])

    if args.interactive:  # one conversation: one slot, its K/V kept from turn to turn
        from gearshift.cli.interactive import run_interactive

        engine = Engine(loaded, max_batch=1,
                        max_seq_len=min(loaded.config.max_position_embeddings, DEFAULT_MAX_MODEL_LEN))
        return run_interactive(engine, pol.build(args, loaded), sampling, args.chat, args.system, prompts)
    engine = Engine(loaded, max_batch=args.batch_size)
    requests = [Request(engine.encode_prompt(text, chat=args.chat, system=args.system), sampling())
                for text in prompts]
    policy = pol.build(args, loaded)
    stream = not args.json and len(prompts) == 1 and sys.stdout.isatty()
    on_event = (lambda ev: (sys.stdout.write(ev.text), sys.stdout.flush())) if stream else None
    results = engine.generate(requests, policy, on_event=on_event)
    stats = dict(engine.last_stats)
    stats["model"] = loaded.source
    stats["weights"] = loaded.weight_summary()
    if "policy_map" in loaded.info:  # on a GPU: which kernel policy map the dispatcher ran (own, borrowed, rules)
        stats["policy_map"] = loaded.info["policy_map"]
    if args.json:
        out = {"outputs": [{"text": r.text, "token_ids": r.token_ids, "finish_reason": r.finish_reason,
                            "prompt_tokens": r.prompt_tokens, **({"stats": r.stats} if r.stats else {})}
                           for r in results],
               "stats": stats}
        print(json.dumps(out))
        return 0
    if stream:
        print()
    else:
        for i, r in enumerate(results):
            if len(results) > 1:
                print(f"--- [{i}] {prompts[i]!r}")
            print(r.text)
    extras = "".join(f", {k} {stats[k]}" for k in ("acceptance_rate", "mean_accepted_length", "gear_counts")
                     if k in stats)
    print(f"[{stats['generated_tokens']} tokens in {stats['wall_s']:.2f} s, {stats['tokens_per_s']:.1f} tok/s, "
          f"policy {stats['policy']}, mode {stats['mode']}{extras}]", file=sys.stderr)
    return 0
