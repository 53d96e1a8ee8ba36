"""`gearshift tiny-model OUT`: write a random-weight model in HF layout."""

from __future__ import annotations


from gearshift.cli.common import HelpFormatter
from gearshift.model.tiny import PRESETS


def register(sub) -> None:
    p = sub.add_parser("tiny-model", help="write a random-weight model (HF layout, with tokenizer)",
                       description="Write a random-weight Llama-family model folder that transformers and gearshift "
                                   "both load: for tests, demos and benchmarks at real shapes without downloads.",
                       formatter_class=HelpFormatter)
    p.add_argument("out", help="output folder (must not exist or be empty)")
    p.add_argument("--config", default="tiny", help=f"preset ({', '.join(PRESETS)}) or a config.json path")
    p.add_argument("--layers", type=int, default=None, help="override num_hidden_layers")
    p.add_argument("--vocab-size", type=int, default=None, help="override vocab_size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.set_defaults(handler=run)


def run(args) -> int:
    from gearshift.model.tiny import write_random_model

    out = write_random_model(args.out, args.config, seed=args.seed, dtype=args.dtype, progress=True,
                             num_hidden_layers=args.layers, vocab_size=args.vocab_size)
    print(out)
    return 0
