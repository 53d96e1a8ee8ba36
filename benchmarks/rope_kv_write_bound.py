"""What fusing RoPE + the KV-cache write into decode attention could save at most (GPU, timing only;
stop 46): the engine's graphed decode step as shipped against the same step without the
`rope_kv_write` launch (attention then reads unrotated q and stale keys: wrong results).

    PYTHONPATH=. python benchmarks/rope_kv_write_bound.py --mode w4a16 --batches 1,2,4,16

Stop 46 on the H100 (this script's ad-hoc first form, the same patch; 5 alternating rounds, 512 cached
keys): without the launch the W4A16 step took 0.980 / 0.980 / 1.012 / 0.983 of the shipped one at batch
1 / 2 / 4 / 16, W4A8 (int4-prog) 1.016 / 0.992 at 1 / 4. A fused kernel
would also have to do the rotation and the write, so it would gain at most 2% and lose at some batches: not built.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from trigger_matrix import alternate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="w4a16")
    ap.add_argument("--int4-prog", action="store_true")
    ap.add_argument("--batches", default="1,2,4,16")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("rope_kv_write_bound.py times CUDA graphs: it needs a GPU")

    from e2e import model_for
    from gearshift.dispatch import get_dispatcher
    from gearshift.kernels.rope_kv_write import split_qkv
    from gearshift.model.kv_cache import KVCache
    from gearshift.model.step_timer import DecodeStepTimer

    shipped = KVCache.write_rotated

    def without(self, layer, qkv, n_q, cos, sin, targets):
        return split_qkv(qkv, n_q, self.k.shape[2], self.k.shape[-1])[0]

    model = model_for({}, "llama3-8b", a.mode, a.int4_prog)
    d = get_dispatcher()
    sides = {"shipped": shipped, "without rope_kv_write": without}
    try:
        for b in (int(v) for v in a.batches.split(",")):
            timers = {n: DecodeStepTimer(model, a.mode, b, a.context) for n in sides}  # one capture each
            def run(n, timers=timers):
                KVCache.write_rotated = sides[n]
                return timers[n].ms(d)

            t = alternate(list(sides), a.rounds, run)
            base, other = t["shipped"], t["without rope_kv_write"]
            print(f"{a.mode} batch {b}: shipped {statistics.median(base):.3f} ms, without the launch "
                  f"{statistics.median(other):.3f} ({statistics.median(x / y for x, y in zip(other, base)):.3f})", flush=True)
            del timers
    finally:
        KVCache.write_rotated = shipped


if __name__ == "__main__":
    main()
