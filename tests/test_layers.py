"""The package's layers, read from its own imports: each module imports only from its own
layer or the ones below, and no modules import each other in a circle. A newcomer can
then read the code bottom up, and a change low down cannot be broken by one above it."""

from __future__ import annotations

import ast
from pathlib import Path

import rlboost

ROOT = Path(rlboost.__file__).parent

# top to bottom; a module belongs to the first entry that is its name or a package above it
LAYERS = [
    ["rlboost.cli", "rlboost.__main__"],
    ["rlboost.run"],
    ["rlboost.recipes"],
    ["rlboost.config"],
    ["rlboost.cluster", "rlboost.sim"],
    ["rlboost.trainer", "rlboost.controller"],
    ["rlboost.rollout"],
    ["rlboost.migration"],
    ["rlboost.transfer"],
    ["rlboost.models", "rlboost.tasks", "rlboost.environments"],
    ["rlboost.errors", "rlboost.env", "rlboost.validate", "rlboost.inputs", "rlboost.timing", "rlboost._C", "rlboost"],
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every rlboost module the file imports, at the top or inside functions (`from a import
    b` imports module a.b when there is one, else a name of module a)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("rlboost")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlboost"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return found


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    modules = set(paths) | {"rlboost._C"}
    return {name: {t for t in _imports(path, modules) if t in modules and t != name}
            for name, path in paths.items()}


def _layer(module: str) -> int:
    for depth, layer in enumerate(LAYERS):
        if any(module == top or module.startswith(top + ".") for top in layer if top != "rlboost"):
            return depth
    return len(LAYERS) - 1  # rlboost/__init__ and the top-level leaves


def test_every_module_has_a_layer():
    tops = {m.split(".")[1] for m in _graph() if m.count(".") >= 1}
    named = {top.split(".")[1] for layer in LAYERS for top in layer if top.count(".") == 1}
    assert tops <= named, f"modules outside every layer: {sorted(tops - named)}"


def test_no_import_runs_up_the_layers():
    graph = _graph()
    upward = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                    if _layer(b) < _layer(a))
    assert upward == []


def test_no_modules_import_each_other_in_a_circle():
    graph, state, circles = _graph(), {}, []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                path = stack + [node]
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, stack + [node])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert circles == []


def test_the_controller_and_every_record_it_receives_load_no_torch():
    """The controller process unpickles only its own modules and what crosses to it: instance
    handles (their class's module), handoff tickets, token-only migration batches and
    states. None of them may load torch, which costs each run's controller about a second
    of CPU and 150 MB at start."""
    import subprocess
    import sys

    modules = ["rlboost.controller.actor", "rlboost.cluster.instance", "rlboost.cluster.session",
               "rlboost.migration.ticket", "rlboost.migration.result", "rlboost.migration.batch",
               "rlboost.migration.state", "rlboost.transfer.config"]
    code = f"import sys; import {', '.join(modules)}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
