"""DESIGN.md's layers: every import inside gearshift points down (cli / serve > engine > decode > model >
dispatch > kernels > quant), lazy imports inside functions included."""

import ast
from pathlib import Path

LAYERS = ["cli", "serve", "engine", "decode", "model", "dispatch", "kernels", "quant"]
ROOT = Path(__file__).resolve().parents[1] / "gearshift"


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def test_imports_point_down():
    rank = {name: i for i, name in enumerate(LAYERS)}
    assert sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()) \
        == sorted(LAYERS + ["data"]), "a new package needs its place in DESIGN.md's layers"
    up = []
    for path in ROOT.rglob("*.py"):
        mine = path.relative_to(ROOT).parts[0]
        if mine not in rank:
            continue
        for line, module in _imports(path):
            parts = module.split(".")
            if parts[0] == "gearshift" and len(parts) > 1 and rank.get(parts[1], len(LAYERS)) < rank[mine]:
                up.append(f"{path.relative_to(ROOT.parent)}:{line} imports {module}")
    assert not up, "imports pointing up:\n" + "\n".join(up)
