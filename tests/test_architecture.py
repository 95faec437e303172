"""The shape of the code, checked by reading it with ``ast`` (nothing is imported or run): no import cycle
among the project's own modules, and layers that import downward only (STYLE.md "Layers import downward
only", DESIGN.md "Shape of the shared library").

Every import counts: module level, inside functions, under ``if TYPE_CHECKING:`` (a deferred import that
dodges a cycle is still a cycle). The layers, low to high, and their groups:

    0  core      agmarl_common.core: .cluster, .scoring, .sim, .policies, .features, .reward, .adaptive, .pathnames
    1  runtime   agmarl_common.runtime: .messages, .subjects, .bus, .service, .telemetry, .metrics, .settings,
                 .natsserver, .natsauth, .permissions, .health
    2  kube      agmarl_common.kube (conversion, the client loader)  |  serving  agmarl_common.serving
                 (.onnx_model, .modelstore, .signing)
    3  services  agmarl_<service>, one group each
    4  cli       agmarl_cli
    5  rigs      agmarl_testing (libs/testing: test rigs, never shipped; may wire a service, nothing imports them)

A module imports its own group and lower layers only: never a higher layer, never a sibling group of its
layer (no service imports another service; kube and serving stay apart; nothing shipped imports a test
rig). Inside the core: the cluster model imports no other part of it; the pure pair scorers
(``core.scoring``, the kube-scheduler plugins and the reward-aware score) sit below both the policies and
the features and import neither, nor the simulator; features do not import policies; the reward does not
import the simulator. A library test (libs/common/tests) imports and runs the library
only: no service, no CLI, not even as ``python -m agmarl_trainer...`` in a string.

A current import that breaks a rule and needs a larger move to fix would be listed in ``ALLOWED`` with its
reason (the list is empty now); an entry that no longer matches an import fails too, so the list only
shrinks.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_ROOTS = [ROOT / "libs" / "common", ROOT / "libs" / "testing", ROOT / "cli", *sorted(p for p in (ROOT / "services").iterdir() if p.is_dir())]
LIBRARY_TESTS = ROOT / "libs" / "common" / "tests"

# module pattern -> (layer, group); the longest matching pattern wins. "x" matches x and x.*, "x*" any
# module whose name starts with x. Top-level agmarl_<service> packages are layer 3, their own group.
LAYERS = {
    "agmarl_common": (0, "core"),  # the package itself (a docstring only)
    "agmarl_common.core": (0, "core"),
    "agmarl_common.runtime": (1, "runtime"),
    "agmarl_common.kube": (2, "kube"),
    "agmarl_common.serving": (2, "serving"),
    "agmarl_cli": (4, "cli"),
    "agmarl_testing": (5, "rigs"),  # above everything: a rig may wire a service, nothing shipped imports a rig
}
SERVICE_LAYER = 3

# rules inside one group: (importer pattern, imported pattern, rule)
FORBIDDEN = [
    *[("agmarl_common.core.cluster", core, "the cluster model and hard filter are the bottom of the core")
      for core in ("agmarl_common.core.sim", "agmarl_common.core.policies", "agmarl_common.core.features*", "agmarl_common.core.reward",
                   "agmarl_common.core.adaptive", "agmarl_common.core.scoring")],
    *[("agmarl_common.core.scoring", core, "the pair scorers sit below the policies and the features, beside the simulator")
      for core in ("agmarl_common.core.policies", "agmarl_common.core.features*", "agmarl_common.core.sim",
                   "agmarl_common.core.adaptive")],
    ("agmarl_common.core.features*", "agmarl_common.core.policies", "features do not import policies"),
    ("agmarl_common.core.reward", "agmarl_common.core.sim", "the reward does not import the simulator"),
]

# (importer, imported) -> why it is still here. Importer: a module, or a library test file (path from the
# repository root). Imported: a module, or for a library test the package it names.
ALLOWED: dict[tuple[str, str], str] = {}


def _matches(module: str, pattern: str) -> bool:
    if pattern.endswith("*"):
        return module.startswith(pattern[:-1])
    return module == pattern or module.startswith(pattern + ".")


def layer_of(module: str) -> tuple[int, str] | None:
    """(layer, group) of a project module; None for an agmarl_common module no pattern covers."""
    hits = [p for p in LAYERS if _matches(module, p)]
    if hits:
        return LAYERS[max(hits, key=len)]
    top = module.split(".")[0]
    return None if top == "agmarl_common" else (SERVICE_LAYER, top)


def project_modules() -> dict[str, Path]:
    """Dotted name -> file of every module of every agmarl_* package (libs/common, cli, services/<name>)."""
    out = {}
    for root in PACKAGE_ROOTS:
        for pkg in sorted(root.glob("agmarl_*/")):
            for path in sorted(pkg.rglob("*.py")):
                parts = list(path.relative_to(root).with_suffix("").parts)
                if "__pycache__" in parts:
                    continue
                if parts[-1] == "__init__":
                    parts.pop()
                out[".".join(parts)] = path
    return out


MODULES = project_modules()


def imports(tree: ast.AST, package: str) -> list[tuple[str, int]]:
    """(project module, line) of every import anywhere in ``tree`` (functions and TYPE_CHECKING blocks
    included). ``package`` resolves relative imports. ``from pkg import name`` counts as pkg.name when that
    is a module, as pkg otherwise; ``import a.b.c`` as the longest project module it names."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                name = next((".".join(parts[:k]) for k in range(len(parts), 0, -1)
                             if ".".join(parts[:k]) in MODULES), None)
                if name:
                    out.append((name, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                name = f"{base}.{alias.name}"
                if name in MODULES:
                    out.append((name, node.lineno))
                elif base in MODULES:
                    out.append((base, node.lineno))
    return out


def import_graph() -> dict[str, dict[str, int]]:
    """Importer -> {imported project module: first line}."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in MODULES.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: dict[str, int] = {}
        for target, line in imports(ast.parse(path.read_text(encoding="utf-8")), package):
            if target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


GRAPH = import_graph()


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_cycle_through(sorted(component), graph))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _cycle_through(component: list[str], graph: dict[str, dict[str, int]]) -> list[str]:
    """One import cycle from the component's first module back to it (breadth first, inside the component)."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w in members and w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    return component


def _describe(cycle: list[str]) -> str:
    return " -> ".join(f"{a} (line {GRAPH[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def layer_violations() -> dict[tuple[str, str], str]:
    """(importer, imported) -> the rule it breaks, for every project module."""
    out = {}
    for module, edges in GRAPH.items():
        mine = layer_of(module)
        for target in edges:
            theirs = layer_of(target)
            if mine is None or theirs is None:
                continue  # reported by test_every_library_module_has_a_layer
            if theirs[0] > mine[0]:
                out[(module, target)] = f"layer {mine[0]} ({mine[1]}) imports layer {theirs[0]} ({theirs[1]})"
            elif theirs[0] == mine[0] and theirs[1] != mine[1]:
                out[(module, target)] = f"{mine[1]} imports its sibling {theirs[1]}"
            else:
                for src, dst, rule in FORBIDDEN:
                    if _matches(module, src) and _matches(target, dst):
                        out[(module, target)] = rule
    return out


_ABOVE_LIBRARY = re.compile(r"\b(agmarl_(?!common\b)[a-z_]+)\b")


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = (n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                                           ast.AsyncFunctionDef)))
    return {id(n.body[0].value) for n in nodes
            if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def library_test_violations() -> dict[tuple[str, str], str]:
    """(test file, package) -> how a library test reaches above the library: an import of a service or the
    CLI, or a string naming one (``python -m agmarl_trainer.cli``, code run in a subprocess); docstrings
    and comments aside."""
    tops = {m.split(".")[0] for m in MODULES} - {"agmarl_common", "agmarl_testing"}  # rigs are for tests
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(LIBRARY_TESTS.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for target, line in imports(tree, "tests"):
            if target.split(".")[0] in tops:
                found[(rel, target.split(".")[0])].append(f"imports {target} (line {line})")
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                for name in set(_ABOVE_LIBRARY.findall(node.value)) & tops:
                    found[(rel, name)].append(f"names {name} in a string (line {node.lineno})")
    return {k: ", ".join(sorted(v, key=lambda s: int(s.rsplit(" ", 1)[1][:-1]))) for k, v in found.items()}


def test_the_walk_finds_every_package_and_the_imports_inside_functions():
    tops = {m.split(".")[0] for m in MODULES}
    assert {"agmarl_common", "agmarl_cli", "agmarl_inference", "agmarl_trainer"} <= tops
    tree = ast.parse("import numpy\n"
                     "def f():\n    from agmarl_common.core.cluster import model\n"
                     "if TYPE_CHECKING:\n    import agmarl_common.core.reward\n"
                     "from .base import PolicyBase\n"
                     "from agmarl_common.core.cluster.model import Pod\n")
    assert sorted(imports(tree, "agmarl_common.core.policies")) == [
        ("agmarl_common.core.cluster.model", 3), ("agmarl_common.core.cluster.model", 7), ("agmarl_common.core.policies.base", 6),
        ("agmarl_common.core.reward", 5)]


def test_cycles_are_found_with_the_path_through_them():
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1, "d": 1}, "d": {}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def test_no_import_cycles():
    found = cycles(GRAPH)
    assert not found, "import cycles (deferred and TYPE_CHECKING imports count):\n" + \
        "\n".join(_describe(c) for c in found)


def test_every_library_module_has_a_layer():
    missing = sorted(m for m in MODULES if layer_of(m) is None)
    assert not missing, f"give these modules a layer in LAYERS: {missing}"


def test_layers_import_downward_only():
    bad = {k: v for k, v in layer_violations().items() if k not in ALLOWED}
    assert not bad, "imports against the layers:\n" + "\n".join(
        f"{a} -> {b} (line {GRAPH[a][b]}): {why}" for (a, b), why in sorted(bad.items()))


def test_library_tests_do_not_run_services_or_the_cli():
    bad = {k: v for k, v in library_test_violations().items() if k not in ALLOWED}
    assert not bad, "library tests reaching above the library:\n" + "\n".join(
        f"{a}: {why}" for (a, _), why in sorted(bad.items()))


def _exists(importer: str) -> bool:
    return importer in MODULES or (ROOT / importer).is_file()


def test_the_allow_list_holds_only_current_exceptions():
    current = set(layer_violations()) | set(library_test_violations())
    stale = sorted(k for k in set(ALLOWED) - current if _exists(k[0]))  # skip files not in this tree
    assert not stale, f"remove these ALLOWED entries, the import is gone: {stale}"


def test_the_pair_scorers_sit_below_policies_and_features():
    def rules(importer: str, imported: str) -> list[str]:
        return [rule for src, dst, rule in FORBIDDEN if _matches(importer, src) and _matches(imported, dst)]

    for above in ("agmarl_common.core.policies.kube", "agmarl_common.core.features.pairs", "agmarl_common.core.sim.inflation"):
        assert rules("agmarl_common.core.scoring.rewardaware", above), above
    assert rules("agmarl_common.core.cluster.model", "agmarl_common.core.scoring.kube_resources")
    assert not rules("agmarl_common.core.features.pairs", "agmarl_common.core.scoring.rewardaware")
    # one owner, shared: both the expert policy and the model's reward_gain column read the same scorer
    assert "agmarl_common.core.scoring.rewardaware" in GRAPH["agmarl_common.core.policies.rewardaware"]
    assert "agmarl_common.core.scoring.rewardaware" in GRAPH["agmarl_common.core.features.pairs"]
