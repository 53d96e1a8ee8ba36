"""`gearshift serve`: an OpenAI-compatible HTTP server (completions and chat, streamed or not)."""

from __future__ import annotations

import os

from gearshift.cli.common import DEFAULT_MAX_MODEL_LEN, HelpFormatter, add_model_args
from gearshift.cli.generate import add_decode_args, load_for_policies, policy_module
from gearshift.errors import GearshiftError


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API",
                       description="Serve /v1/completions and /v1/chat/completions (streamed with stream=true),\n"
                                   "/v1/models, /health and /stats. Every request joins the running batch as a KV\n"
                                   "slot frees up; the decode policy and precision modes are fixed at launch.\n"
                                   "Sampling follows the OpenAI defaults (temperature 1): send temperature 0 for\n"
                                   "greedy output. n completions per prompt, logprobs (of prompts with echo and\n"
                                   "max_tokens 0, of generated text otherwise; not streamed). Needs fastapi and\n"
                                   "uvicorn (pip install 'gearshift[serve]').",
                       epilog="example:\n  gearshift serve --model PATH --policy qspec --draft-mode w4a8\n"
                              "  curl localhost:8000/v1/completions -H 'Content-Type: application/json' \\\n"
                              "       -d '{\"prompt\": \"The capital of France is\", \"max_tokens\": 16, "
                              "\"temperature\": 0}'",
                       formatter_class=HelpFormatter)
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients send and /v1/models lists (default: the model file or folder's name)")
    p.add_argument("--batch-size", type=int, default=8,
                   help="sequences decoded together (KV slots); later requests wait for a free slot (default: 8)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="context per sequence that the KV cache is sized for; prompt + max_tokens beyond it is "
                        f"refused (default: the model's, at most {DEFAULT_MAX_MODEL_LEN})")
    p.add_argument("--modes", default=None, metavar="M[,M...]",
                   help="with --policy ar: precision modes a request may ask for by model id: NAME:MODE (e.g. "
                        "tiny:w4a8) runs that mode, NAME runs --mode. One weight store serves them all; a step "
                        "whose batch mixes modes runs one forward per mode. Default: --mode only")
    p.add_argument("--no-prefix-reuse", dest="prefix_reuse", action="store_false",
                   help="prefill every prompt in full. By default (with --policy ar) a KV slot keeps the last "
                        "request's tokens, and a prompt that starts with them (a chat client resending the "
                        "conversation) prefills only the rest; usage.prompt_tokens_details.cached_tokens counts "
                        "them. Reused entries were written a token at a time while decoding, which can round "
                        "differently from a prefill of the same tokens")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="take requests as soon as the model is loaded. By default (on a GPU) the server first runs "
                        "prefills of every token bucket, for one sequence and for a full batch, and decode steps at "
                        "every narrower step width, so that the first requests of each size do not wait for Triton "
                        "compiles or CUDA graph captures (seconds each at 8B scale). It took 90-125 s on a first "
                        "start of an 8B model on an H200 and 12-14 s on a later one (Triton keeps the compiled "
                        "kernels on disk)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on the /v1 endpoints (401 otherwise; /health, "
                        "/stats and /metrics stay open); default: $GEARSHIFT_API_KEY, else none")
    add_decode_args(p)
    p.set_defaults(handler=run)


def kv_cache_bytes(config, batch: int, tokens: int, dtype_bytes: int) -> int:
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * batch * tokens * dtype_bytes


def build_server(args):
    """(app, worker, model name): the loaded model behind a running engine thread, and the FastAPI app."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ModuleNotFoundError:
        raise GearshiftError("gearshift serve needs fastapi and uvicorn: pip install 'gearshift[serve]'") from None
    from gearshift.engine.engine import Engine
    from gearshift.model.loader import note
    from gearshift.serve.openai_api import create_app
    from gearshift.serve.worker import EngineWorker

    if args.batch_size < 1:
        raise GearshiftError("--batch-size must be >= 1")
    if getattr(args, "trace_out", None):
        raise GearshiftError("--trace-out renders the requests of one generate run; a server keeps no traces")
    if args.max_model_len is not None and args.max_model_len < 2:
        raise GearshiftError("--max-model-len must be >= 2")
    pol = policy_module(args.policy)
    modes = [m.strip() for m in (args.modes or "").split(",") if m.strip()]
    if modes and args.policy != "ar":
        raise GearshiftError("--modes needs --policy ar (QSPEC and GEARBX choose their modes themselves)")
    modes = list(dict.fromkeys([args.mode] + modes)) if modes else []
    loaded = load_for_policies(args, [pol], extra_modes=modes)
    allowed = loaded.config.max_position_embeddings
    max_len = args.max_model_len or min(allowed, DEFAULT_MAX_MODEL_LEN)
    if args.max_model_len is None and allowed > max_len:
        note(f"the KV cache holds {max_len} tokens per sequence (the model allows {allowed}): --max-model-len "
             "raises it")
    if max_len > allowed:
        raise GearshiftError(f"--max-model-len {max_len} exceeds the model's context of {allowed} tokens")
    engine = Engine(loaded, max_batch=args.batch_size, max_seq_len=max_len)
    if len(modes) > 1:
        from gearshift.decode.per_request_mode import PerRequestModePolicy

        policy = PerRequestModePolicy(loaded.model, modes, default=args.mode)
    else:
        policy = pol.build(args, loaded)
    gib = kv_cache_bytes(loaded.config, args.batch_size, max_len + policy.lookahead + 1,
                         loaded.model.dtype.itemsize) / 2**30
    staging = (f"; one slot more, {gib / args.batch_size:.2f} GiB, where prefills joining the batch replay their "
               "CUDA graphs" if getattr(loaded.model, "use_cuda_graphs", False) and args.batch_size > 1 else "")
    note(f"KV cache: {args.batch_size} sequences x {max_len} tokens ({gib:.2f} GiB{staging})")
    name = args.served_model_name or os.path.basename(os.path.normpath(str(loaded.source)))
    if getattr(args, "warmup", True) and loaded.model.device.type == "cuda":
        from gearshift.engine.warmup import warm_up

        runs, seconds = warm_up(engine, policy)
        note(f"warmed up in {seconds:.1f} s ({runs} runs of prefill and decode shapes; --no-warmup skips this)")
    worker = EngineWorker(engine, policy, prefix_reuse=args.prefix_reuse)
    if loaded.model.device.type == "cuda":
        worker.compile_watch = watch_compiles()
    worker.start()
    api_key = getattr(args, "api_key", None) or os.environ.get("GEARSHIFT_API_KEY")  # (not in --help's text)
    return create_app(worker, name, api_key=api_key), worker, name


def watch_compiles():
    """A started `CompileWatch` that reports each Triton compile while serving (a stall of the running batch,
    at a shape the warm-up missed) on stderr; None where this Triton has no compile hooks."""
    from gearshift.kernels.compile_watch import CompileWatch
    from gearshift.model.loader import note

    def report(ev) -> None:
        note(f"Triton compiled {ev.kernel} while serving ({ev.seconds:.2f} s; a shape the warm-up did not "
             f"cover, counted in /stats): {ev.signature}")

    watch = CompileWatch(on_compile=report)
    return watch if watch.start() else None


def check_port(host: str, port: int) -> None:
    """Refuse a port that is taken before the model loads (minutes, for a large one), in one line."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise GearshiftError(f"--host {host!r} does not resolve: {e.strerror}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a TIME_WAIT port is free
        try:
            s.bind(addr)
        except OSError as e:
            raise GearshiftError(f"cannot listen on {host}:{port}: {e.strerror} (--port picks another)") from None


def run(args) -> int:
    import uvicorn

    check_port(args.host, args.port)
    app, worker, name = build_server(args)
    modes = ", ".join(worker.policy.modes)
    print(f"gearshift serve: {name} (policy {args.policy}, {modes}) on http://{args.host}:{args.port}/v1", flush=True)
    try:  # no ASGI lifespan: the engine thread is started and closed here, and Ctrl-C stays quiet
        uvicorn.run(app, host=args.host, port=args.port, log_level="info", lifespan="off")
    except KeyboardInterrupt:  # uvicorn shuts down on the first Ctrl-C, then raises it again
        pass
    finally:
        worker.close(timeout=10)
    return 0
