"""The README's set-up commands are the ones CI runs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = next(l for l in ci.splitlines() if l.startswith("pip install") and "pytest" in l)
    assert test_cmd in readme
    blocks = [l for l in readme.splitlines() if l.startswith("pip install torch==2.13.0")]
    assert len(blocks) == 2, "the README has exactly two set-up commands"
    assert "gearshift generate" in blocks[0]
