"""A stack sampler for a `gearshift serve` process: what the engine thread was doing during a stall.

Python imports this at start-up when its folder comes first on PYTHONPATH and $STACK_OUT names a folder
(`benchmarks/serve_load.py --sample-stacks` sets both); any other process, or one without $STACK_OUT, is left
alone. Every 10 ms it records each thread's innermost 18 frames, and it writes them to
$STACK_OUT/stacks_<pid>.json.gz every 2 s once a thread other than the main one runs, and on SIGTERM (uvicorn
re-raises it after its shutdown, so an exit hook would never run). It also notes on stderr each Triton kernel
load and CUDA graph capture over 20 ms, and each time it was itself kept from running for over 80 ms (the GIL
held by C code). `benchmarks/stall_report.py` reads the file. Stop 58 found the 1.3 s serve stall with it: one
SDPA call. It shadows any other sitecustomize on the path while in use.
"""
import os
import sys

if os.environ.get("STACK_OUT") and "serve" in sys.argv:
    import gzip
    import json
    import signal
    import threading
    import time

    _stacks, _ids, _samples = [], {}, []

    def _say(msg):
        sys.stderr.write(f"stack-sampler {time.perf_counter():.3f} [{threading.current_thread().name}] {msg}\n")
        sys.stderr.flush()

    def _dump():
        path = os.path.join(os.environ["STACK_OUT"], f"stacks_{os.getpid()}.json.gz")
        with gzip.open(path + ".tmp", "wt", compresslevel=1) as f:
            json.dump({"stacks": _stacks, "samples": _samples[-60000:]}, f)
        os.replace(path + ".tmp", path)

    def _loop():
        last, prev = time.time(), time.perf_counter()
        while True:
            time.sleep(0.01)
            now = time.perf_counter()
            if now - prev > 0.08:
                _say(f"kept from running for {now - prev:.3f} s")
            prev = now
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == threading.get_ident():
                    continue
                st = []
                while frame is not None and len(st) < 18:
                    code = frame.f_code
                    st.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno}:{code.co_name}")
                    frame = frame.f_back
                sid = _ids.setdefault(tuple(st), len(_stacks))
                if sid == len(_stacks):
                    _stacks.append(st)
                _samples.append((round(now, 4), names.get(ident, str(ident)), sid))
            serving = any(n not in ("MainThread", "tqdm_monitor", "stack-sampler") for n in names.values())
            if time.time() - last > (2 if serving else 15):
                _dump()
                last = time.time()

    def _timed(owner, attr, label):
        orig = getattr(owner, attr)

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                if dt > 0.02:
                    _say(f"{label} {dt:.3f} s {getattr(args[0], 'name', '') if args else ''}")
        setattr(owner, attr, wrapper)

    def _on_term(signum, frame):  # uvicorn restores this handler and re-raises SIGTERM once it has shut down
        _dump()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, _on_term)
    threading.Thread(target=_loop, daemon=True, name="stack-sampler").start()
    try:
        import torch
        import triton.compiler.compiler as _compiler

        _timed(_compiler.CompiledKernel, "_init_handles", "Triton kernel load")
        _timed(torch.cuda.CUDAGraph, "capture_end", "CUDA graph capture end")
    except Exception as e:  # noqa: BLE001 - a diagnostic: sample anyway
        _say(f"no load / capture timings: {e!r}")
