"""The layout is the architecture: every import, lazy ones included, points down the floors
of docs/architecture.md, and no modules import each other in a circle."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Top to bottom. A module may import from its own package and from lower floors; packages
# that share a floor stay out of each other.
FLOORS = [
    ["ddrl.cli", "ddrl.__main__", "ddrl.commands", "ddrl.bench", "analysis"],
    ["ddrl.loop", "ddrl.placement"],
    ["ddrl.acting", "ddrl.distributed"],
    ["ddrl.learner"],
    ["ddrl.algos", "ddrl.models", "ddrl.envs", "ddrl.optim"],
    ["ddrl.config", "ddrl.config_docs", "ddrl.rundir", "ddrl.signals",
     "ddrl.errors", "ddrl.recipe",
     "ddrl.output", "ddrl.seeding", "ddrl.cpus", "ddrl.heap", "ddrl"],
]


def room(module: str) -> tuple[int, str]:
    """(floor, package) of a module: the longest prefix named in FLOORS."""
    best = None
    for floor, rooms in enumerate(FLOORS):
        for r in rooms:
            inside = module == r or (module.startswith(r + ".") and r != "ddrl")
            if inside and (best is None or len(r) > len(best[1])):
                best = (floor, r)
    assert best is not None, f"{module} is on no floor: add it to FLOORS and the architecture page"
    return best


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted([*ROOT.glob("ddrl/**/*.py"), *ROOT.glob("analysis/**/*.py")]):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + [base]).strip(".")
            # `from ddrl import checkpoint` names a module; `from ddrl.x import f` a member.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def test_imports_point_down_the_floors():
    wrong = []
    for name, targets in graph().items():
        floor, pkg = room(name)
        for t in targets:
            t_floor, t_pkg = room(t)
            if t_floor < floor or (t_floor == floor and t_pkg != pkg and floor != len(FLOORS) - 1
                                   and floor != 0):
                wrong.append(f"{name} (floor {floor}) imports {t} (floor {t_floor})")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    g = graph()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for t in sorted(g[node]):
            if state.get(t) == 1:
                return path + [node, t]
            if t not in state and (cycle := visit(t, path + [node])):
                return cycle
        state[node] = 2
        return None

    for name in sorted(g):
        if name not in state:
            cycle = visit(name, [])
            assert cycle is None, " -> ".join(cycle[cycle.index(cycle[-1]):])
