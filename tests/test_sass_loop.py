"""`benchmarks/mma_ablations/sass_loop.py` finds the fragment kernel's main loop in the sm_90 SASS and
counts it by kind (CPU: Triton ships ptxas and nvdisasm; skipped where this machine cannot compile for
sm_90)."""
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def test_one_token_loop_holds_one_block_of_mmas(compile_sm90):
    counts = compile_sm90(f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
sys.path.insert(0, {str(ROOT / "benchmarks" / "mma_ablations")!r})
import os
from sass_loop import NVDISASM, per_block
from gearshift.kernels.config import TileConfig
if not os.path.exists(NVDISASM):
    sys.exit(3)
for name, cfg in (("stepped", TileConfig(bm=16, bn=0, bk=128, warps=2, stages=1, kwarps=2)),
                  ("pairs", TileConfig(bm=16, bn=0, bk=128, warps=2, stages=1, kwarps=2, pairs=True))):
    where, blocks, c = per_block(cfg, 1, 4096)
    out[name] = dict(where=where, blocks=blocks, **c)
where, blocks, c = per_block(TileConfig(bm=16, bn=0, bk=128, warps=2, stages=1, kwarps=2), 1, 4096, True)
out["fragment"] = dict(where=where, blocks=blocks, **c)
""")
    for name, blocks in (("stepped", 1), ("pairs", 2)):
        c = counts[name]
        assert c["where"] == "loop" and c["blocks"] == blocks
        # 16 rows x 128 columns per block: 8 weight MMAs (m16n8k16) and 8 token-sum MMAs
        assert c["mma"] == 16 * blocks
        assert c["unpack"] >= 32 * blocks  # one LOP3 per nibble pair, 8 words per lane and block
    # a one-block loop rotates its prefetched registers at its end; a two-block (pairs) loop does not
    assert counts["stepped"].get("copy", 0) > 0 and counts["pairs"].get("copy", 0) == 0
    # inputs in fragment order: the 16 input PRMTs of the block go, nothing else is added
    nat, frag = counts["stepped"], counts["fragment"]
    assert frag["pair x"] <= nat["pair x"] - 16 and frag["mma"] == nat["mma"]
    total = [sum(v for k, v in c.items() if k not in ("where", "blocks")) for c in (nat, frag)]
    assert total[1] <= total[0] - 12, total
