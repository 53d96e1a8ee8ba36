"""The test suite's --shard option (conftest.py), which splits the GPU run over device calls."""

import subprocess
import sys
from pathlib import Path


def test_shards_partition_the_suite():
    """conftest's --shard K/N: the N slices are disjoint and together the unsharded collection."""
    def collect(*extra):
        r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                            "tests/test_jsonfile.py", "tests/test_switches.py", *extra],
                           capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
        return r.returncode, [line for line in r.stdout.splitlines() if "::" in line]

    code, every = collect()
    assert code == 0 and len(every) > 3
    shards = [collect("--shard", f"{k}/3")[1] for k in (1, 2, 3)]
    assert sorted(sum(shards, [])) == sorted(every) and all(shards)
    assert collect("--shard", "4/3")[0] != 0
