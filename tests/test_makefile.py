"""``make demo`` installs what the demo imports (the library, its command line, PySpark) and
not the development toolchain (the test and lint tools, the S3 servers, Playwright, MkDocs),
which ``make test`` installs besides."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
DEMO_PROGRAMS = [REPO / "examples" / "demo.py", REPO / "examples" / "orders_pipeline.py"]


def dry_run(target: str, tmp_path: Path) -> list[str]:
    """What ``make -n TARGET`` would run in a fresh checkout (no virtualenv yet)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    run = subprocess.run(
        ["make", "-n", target], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def installs(commands: list[str]) -> list[str]:
    """The pip installs of the project (not pip's own upgrade)."""
    return [line for line in commands if "pip install" in line and "--upgrade pip" not in line]


def closure(requirements: list[Requirement], extras: set[str]) -> set[str]:
    """The distributions ``requirements`` bring in, with theirs (as installed here)."""
    seen: set[str] = set()
    todo = [
        r
        for r in requirements
        if r.marker is None or any(r.marker.evaluate({"extra": extra}) for extra in {"", *extras})
    ]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            theirs = [Requirement(text) for text in requires(requirement.name) or []]
        except PackageNotFoundError:
            continue  # not installed here (another platform's, say): none of its own known
        todo += [
            r
            for r in theirs
            if r.marker is None
            or any(r.marker.evaluate({"extra": extra}) for extra in {"", *requirement.extras})
        ]
    return seen


# Run in a fresh interpreter: in this one, earlier tests may have imported them already.
_LIST_IMPORTS = """
import importlib.util, sys
before = set(sys.modules)
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("demo_program", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
print("\\n".join(sorted({name.partition(".")[0] for name in set(sys.modules) - before})))
"""


def imported_by_the_demo() -> set[str]:
    """The distributions whose modules the demo's programs import (loading them runs
    nothing: each starts under ``if __name__ == "__main__"``)."""
    run = subprocess.run(
        [sys.executable, "-c", _LIST_IMPORTS, *map(str, DEMO_PROGRAMS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr
    owners = packages_distributions()
    tops = set(run.stdout.split())
    return {canonicalize_name(d) for top in tops for d in owners.get(top, [])}


def test_make_demo_installs_what_the_demo_imports_and_no_dev_tools(tmp_path: Path) -> None:
    pip = installs(dry_run("demo", tmp_path))
    assert pip, "make -n demo installs nothing"
    assert not [line for line in pip if "--group" in line], pip
    extras = {
        extra.strip()
        for line in pip
        for group in re.findall(r'-e "\.\[([^\]]*)\]"', line)
        for extra in group.split(",")
    }
    project = [Requirement(text) for text in PYPROJECT["project"]["dependencies"]]
    project += [
        Requirement(f"{text}; extra == '{extra}'")
        for extra in extras
        for text in PYPROJECT["project"]["optional-dependencies"][extra]
    ]
    installed = closure(project, extras)

    needed = imported_by_the_demo() - {"pawn-queue"}
    assert {"rich", "pyspark"} <= needed  # what the programs are known to import
    assert needed <= installed, "make demo does not install these, which the demo imports"

    dev = {
        canonicalize_name(Requirement(text).name) for text in PYPROJECT["dependency-groups"]["dev"]
    }
    assert dev & installed == set(), "make demo installs development tools"


def test_make_test_installs_the_dev_group_besides(tmp_path: Path) -> None:
    pip = installs(dry_run(".venv/.installed", tmp_path))  # what `make test` depends on
    assert any("--group dev" in line for line in pip), pip
