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


def _pytest(*args):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    return r.returncode, r.stdout


def test_resume_runs_only_what_has_not_passed(tmp_path):
    """--resume FILE: a first run records each passing id, a second one leaves those out and runs the rest."""
    record = tmp_path / "passed.txt"
    code, _ = _pytest("tests/test_jsonfile.py", "--resume", str(record))
    assert code == 0
    passed = record.read_text().splitlines()
    code, out = _pytest("--collect-only", "tests/test_jsonfile.py")
    assert sorted(passed) == sorted(line for line in out.splitlines() if "::" in line)
    record.write_text("\n".join(passed[1:]) + "\n")  # as if the run had been cut after its first test
    code, out = _pytest("tests/test_jsonfile.py", "--resume", str(record), "-rA")
    assert code == 0 and f"PASSED {passed[0]}" in out and f"{len(passed) - 1} deselected" in out
    assert sorted(record.read_text().splitlines()) == sorted(passed)


def test_stop_after_ends_the_run_with_its_summary():
    """--stop-after 0: the first test runs, no later one starts, and pytest reports why with exit code 2."""
    code, out = _pytest("tests/test_jsonfile.py", "--stop-after", "0")
    assert code == 2 and "--stop-after 0" in out and "1 passed" in out
