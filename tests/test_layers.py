"""The code's layers (docs/design.md, "Code layout"), read from the imports themselves: no
module imports a module of a higher layer, no two modules import each other (directly or
round a longer cycle, function-local and TYPE_CHECKING imports included), and the interfaces
(cli, dashboard) reach Redis only through the client API."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "jobqueue"

# Bottom-up. A module belongs to the layer of the longest prefix listed here.
LAYERS: list[tuple[str, ...]] = [
    # what everything shares: errors, the run model, anomalies, settings, the JSON codec
    ("jobqueue.errors", "jobqueue.models", "jobqueue.anomalies", "jobqueue.settings",
     "jobqueue.payload"),
    # Redis (keys, scripts, calls, connections) and the pure rules (cron, jitter, ...)
    ("jobqueue.store", "jobqueue.policy"),
    # what a task, the context it runs with and a recurring job are (its definition, fire
    # planning, the scheduler's config, the store and registry steps: all of jobqueue.recurring
    # but the daemon's modules below and the partitions' move above) and a workflow's steps
    ("jobqueue.recurring", "jobqueue.tasks", "jobqueue.handles", "jobqueue.context",
     "jobqueue.hooks",
     "jobqueue.integrations", "jobqueue.workflows"),
    # the app-facing clients and the facade over the asyncio one
    ("jobqueue.client", "jobqueue.aio"),
    # the operators' tooling over the clients (queries, listings, repair, repartition, health,
    # capacity, gauges), the facade over its reads, and the scheduler partitions' move
    ("jobqueue.ops", "jobqueue.queries", "jobqueue.recurring.repartition"),
    # the daemons and what they run with, and the package's facade (it names the Worker too,
    # imported at first use)
    ("jobqueue.worker", "jobqueue.recurring.daemon", "jobqueue.recurring.firing",
     "jobqueue.recurring.draining", "jobqueue.recurring.buffered", "jobqueue.recurring.lookahead",
     "jobqueue.recurring.membership",
     "jobqueue.runtime", "jobqueue.__init__", "jobqueue.testing"),
    # jobqueue check: its checks of the schedulers (they read the daemons' own records), and
    # every check together
    ("jobqueue.ops.scheduler_checks", "jobqueue.ops.check"),
    # the interfaces
    ("jobqueue.cli", "jobqueue.dashboard", "jobqueue.demo"),
]
INTERFACES = ("jobqueue.cli", "jobqueue.dashboard")
# What only the client layer may use: script calls, their builders, pipelines.
CLIENT_ONLY_MODULES = (
    "jobqueue.store.runs",
    "jobqueue.store.schedules",
    "jobqueue.store.admin",
    "jobqueue.store.catalog",
    "jobqueue.store.pages",
    "jobqueue.store.contract",
    "jobqueue.store.scripts",
)
CLIENT_ONLY_ATTRIBUTES = frozenset({"pipeline", "scripts", "redis", "execute_command"})
# Beyond the clients and the store, Redis is reached through steps (jobqueue.store.io), which
# either client drives, or (in the daemons) through typed script calls: no module touches a
# client's redis, pipelines or raw commands, but these (a module leaves the list when it goes
# through steps):
RAW_CLIENT_USERS = {
    # `jobqueue check`: INFO, CONFIG GET and TIME on every node CLUSTER NODES lists (replicas
    # and nodes redis-py does not know too), TIME timed by the host's clock, SCRIPT LOAD.
    "jobqueue.ops.health",
    # master_names: the cluster client's cached slot map, no I/O.
    "jobqueue.ops.queries",
    # read_owners names each partition's master: the same slot map, no I/O.
    "jobqueue.recurring.membership",
    # the recurring definitions store's sync driver: it is the sync client's half.
    "jobqueue.recurring.sync",
    # hands the connection to RedisIO, the worker's own calls (its claim/complete hot path).
    "jobqueue.worker.daemon",
}
RAW_CLIENT_ATTRIBUTES = frozenset({"pipeline", "redis", "execute_command"})
# The operators' tooling runs no script call of its own either, but `jobqueue check`'s SCRIPT
# LOAD (health).
OPS_WITH_SCRIPTS = {"jobqueue.ops.health"}


def uses(path: Path, attributes: frozenset[str]) -> bool:
    return any(
        isinstance(node, ast.Attribute) and node.attr in attributes
        for node in ast.walk(ast.parse(path.read_text()))
    )


def test_the_client_only_modules_exist() -> None:
    """A renamed module would otherwise leave its rule checking nothing."""
    assert [m for m in CLIENT_ONLY_MODULES if m + ".__init__" not in modules()
            and m not in modules()] == []


def test_only_the_listed_modules_beyond_the_clients_touch_a_raw_client() -> None:
    """A raw ``jq.redis`` call or pipeline exists for the sync client only: what goes
    through steps works on AsyncJobQueue too."""
    found = sorted(
        name
        for name, path in modules().items()
        if not name.startswith(("jobqueue.store.", "jobqueue.client."))
        and uses(path, RAW_CLIENT_ATTRIBUTES)
    )
    assert found == sorted(RAW_CLIENT_USERS)


def test_the_operators_tooling_runs_no_script_call_but_the_health_check() -> None:
    found = sorted(
        name
        for name, path in modules().items()
        if name.startswith("jobqueue.ops.") and uses(path, frozenset({"scripts"}))
    )
    assert found == sorted(OPS_WITH_SCRIPTS)


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts)  # a package is its __init__: jobqueue.cli.__init__


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def package_of(name: str) -> str:
    return name.rsplit(".", 1)[0]  # of jobqueue.cli.runs and of jobqueue.cli.__init__: jobqueue.cli


def resolve(name: str, known: dict[str, Path]) -> str | None:
    """The module a dotted name refers to: itself, its package's __init__, or (for
    ``from pkg import name``) the nearest enclosing module."""
    while name:
        if name in known:
            return name
        if f"{name}.__init__" in known:
            return f"{name}.__init__"
        name = name.rpartition(".")[0]
    return None


def imports_of(name: str, path: Path, known: dict[str, Path]) -> list[Import]:
    """Every import of a jobqueue module anywhere in the file (module level, in functions,
    under TYPE_CHECKING), and the package __init__s it runs: importing ``a.b.c`` from
    outside package ``a.b`` runs ``a/b/__init__.py`` first."""
    tree = ast.parse(path.read_text(), str(path))
    here = package_of(name)
    found: list[Import] = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            targets = [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            if not target.startswith("jobqueue"):
                continue
            resolved = resolve(target, known)
            if resolved is None or resolved == name:
                continue
            found.append(Import(name, resolved, node.lineno))
            # The packages on the way in that the importer is not already inside of.
            package = package_of(resolved)
            while package.count(".") >= 1 and not here.startswith(package):
                init = f"{package}.__init__"
                if init in known and init != name:
                    found.append(Import(name, init, node.lineno))
                package = package.rpartition(".")[0]
    return found


def layer_of(name: str) -> int:
    best, layer = "", -1
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            matches = name == prefix or name.startswith(prefix + ".")
            if matches and len(prefix) > len(best):
                best, layer = prefix, level
    return layer


@cache
def graph() -> dict[str, list[Import]]:
    """Every module's imports, read once per test process (only read, never changed)."""
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, list[Import]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for edge in edges.get(v, []):
            w = edge.imported
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
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_belongs_to_a_layer() -> None:
    assert [name for name in modules() if layer_of(name) < 0] == []


def test_no_module_imports_a_module_of_a_higher_layer() -> None:
    upward = [
        f"{e.importer} (layer {layer_of(e.importer)}) imports {e.imported} "
        f"(layer {layer_of(e.imported)}) at line {e.line}"
        for imports in graph().values()
        for e in imports
        if layer_of(e.imported) > layer_of(e.importer)
    ]
    assert upward == []


def test_no_import_cycle_between_modules() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle_through_a_function_local_import() -> None:
    # The finder itself, on a made-up graph: a -> b at module level, b -> a in a function.
    edges = {"a": [Import("a", "b", 1)], "b": [Import("b", "a", 9)], "c": []}
    assert cycles(edges) == [["a", "b"]]


def test_no_import_in_a_class_body() -> None:
    found = [
        f"{name}:{node.lineno}"
        for name, path in modules().items()
        for cls in ast.walk(ast.parse(path.read_text()))
        if isinstance(cls, ast.ClassDef)
        for node in cls.body
        if isinstance(node, ast.Import | ast.ImportFrom)
    ]
    assert found == []


@pytest.mark.parametrize("interface", INTERFACES)
def test_interfaces_reach_redis_only_through_the_client_api(interface: str) -> None:
    found = []
    for name, path in modules().items():
        if not name.startswith(interface + "."):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in CLIENT_ONLY_ATTRIBUTES:
                found.append(f"{name}:{node.lineno} .{node.attr}")
        for e in graph()[name]:
            if e.imported.startswith(CLIENT_ONLY_MODULES):
                found.append(f"{name}:{e.line} imports {e.imported}")
    assert found == []
