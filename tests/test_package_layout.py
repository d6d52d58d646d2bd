"""The package's layout: no import cycle (type-only and function-level imports included),
at most 20 modules at its top and none over 500 lines, and the imports users have work.
Which layer may import which is the contract in pyproject.toml, checked by ``lint-imports``
(``make lint``)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "pawn_queue"


def import_graph(root: Path, name: str) -> dict[str, set[str]]:
    """Every module of the package under ``root`` (named ``name``) and the package's
    modules it imports anywhere: at the top, under TYPE_CHECKING, or inside a function."""
    modules: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = [name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path

    def targets(module: str, node: ast.Import | ast.ImportFrom, is_package: bool) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        base = node.module or ""
        if node.level:
            here = module.split(".") if is_package else module.split(".")[:-1]
            here = here[: len(here) - node.level + 1]
            base = ".".join([*here, base] if base else here)
        return [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
            for alias in node.names
        ]

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[module] = {
            target
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for target in targets(module, node, path.name == "__init__.py")
            if target in modules and target != module
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_type_only_cycle(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.inner import b\n")
    (package / "inner" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import C\n"
    )
    (package / "c.py").write_text("def f():\n    import pkg.a\n")
    assert cycles(import_graph(package, "pkg")) == [["pkg.a", "pkg.c", "pkg.inner.b"]]


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph(PACKAGE, "pawn_queue")
    assert len(graph) > 90
    assert cycles(graph) == []


def test_the_package_stays_small_at_the_top_and_in_each_module() -> None:
    top = [p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert len(top) <= 20, sorted(top)
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > 500
    }
    assert long == {}


def test_the_imports_users_have_keep_working() -> None:
    import pawn_queue

    for name in pawn_queue.__all__:
        assert getattr(pawn_queue, name).__module__.startswith("pawn_queue.")
        assert not getattr(pawn_queue, name).__module__.startswith(
            ("pawn_queue._internal", "pawn_queue._protocol")
        ), name
    from pawn_queue.config import PollingConfig, S3Config, load_config
    from pawn_queue.consumer import Retry
    from pawn_queue.observe import Observer, Outcome, Publication

    assert Retry is pawn_queue.Retry
    assert {S3Config.section_path, PollingConfig.section_path} == {"s3", "polling"}
    assert callable(load_config) and Observer and Outcome and Publication
    for module in ("pawn_queue.sync", "pawn_queue.testing", "pawn_queue.spark"):
        assert importlib.import_module(module).__all__


# -- the tests' layout ----------------------------------------------------------------------

TESTS = Path(__file__).resolve().parent


def internal_imports(tree: ast.Module) -> list[str]:
    """What ``tree`` imports, anywhere, from the package's internals: a module or name of
    ``pawn_queue`` with a leading underscore in its path (dunders such as ``__version__``
    are public)."""

    def internal(path: str) -> bool:
        root, *parts = path.split(".")
        return root == "pawn_queue" and any(
            part.startswith("_") and not (part.startswith("__") and part.endswith("__"))
            for part in parts
        )

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if internal(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if internal(node.module):
                found.append(node.module)
            else:
                found += [
                    f"{node.module}.{alias.name}"
                    for alias in node.names
                    if internal(f"{node.module}.{alias.name}")
                ]
    return found


def test_the_internal_import_finder_looks_everywhere() -> None:
    source = (
        "import pawn_queue, pawn_queue._protocol.layout\n"
        "from pawn_queue import PawnQueue, __version__, _version\n"
        "from pawn_queue.store import _fs_io\n"
        "from pawn_queue.sync import Message\n"
        "def f():\n"
        "    from pawn_queue._internal.daemon_pool import DaemonThreadPool\n"
        "if True:\n"
        "    from pawn_queue.config import _sections\n"
    )
    assert internal_imports(ast.parse(source)) == [
        "pawn_queue._protocol.layout",
        "pawn_queue._version",
        "pawn_queue.store._fs_io",
        "pawn_queue._internal.daemon_pool",
        "pawn_queue.config._sections",
    ]


def test_the_public_api_tests_import_only_public_names() -> None:
    """The modules at the top of tests/ test the public API: what they need of the store's
    layout comes from tests/helpers/storage.py, tests of the on-store protocol are in
    tests/protocol/, of the internals in tests/internal/ (docs/development/layout.md)."""
    offenders = {
        path.name: found
        for path in sorted(TESTS.glob("test_*.py"))
        if (found := internal_imports(ast.parse(path.read_text(), str(path))))
    }
    assert offenders == {}


def test_no_test_traces_memory_with_tracemalloc() -> None:
    """Under tracemalloc a store client's native thread that first enters Python crashes
    CPython 3.11 (docs/development/layout.md): the suite died of it now and then."""
    users = [
        str(path.relative_to(TESTS))
        for path in sorted(TESTS.rglob("*.py"))
        if path != Path(__file__)
        and any(
            isinstance(node, ast.Import | ast.ImportFrom)
            and "tracemalloc" in ([a.name for a in node.names] + [getattr(node, "module", None)])
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
        )
    ]
    assert users == []
