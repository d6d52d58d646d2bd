"""The package as built: a wheel without build warnings, its license, version, links and extras."""

from __future__ import annotations

import email
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.message import Message
from pathlib import Path

import pytest

import pawn_queue

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The build's output and the wheel, built from a copy of the sources (not the checkout,
    which other runs may be building or testing at the same time)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(
        REPO / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
    )
    out = tmp_path_factory.mktemp("dist")
    # The setuptools of the test install (the dev group), so the build needs no network.
    build = subprocess.run(
        [
            sys.executable,
            "-W",
            "default",
            "-c",
            "import sys; from setuptools import build_meta; "
            "print(build_meta.build_wheel(sys.argv[1]))",
            str(out),
        ],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = build.stdout + build.stderr
    assert build.returncode == 0, output
    [wheel] = out.glob("*.whl")
    return output, wheel


def metadata(wheel: Path) -> tuple[Message, list[str]]:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [path] = [name for name in names if name.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(archive.read(path)), names


def test_building_prints_no_deprecation_warning(built: tuple[str, Path]) -> None:
    output, _ = built
    assert "deprecat" not in output.lower(), output


def test_the_wheel_carries_the_license(built: tuple[str, Path]) -> None:
    meta, names = metadata(built[1])
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    license_text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0" in license_text
    assert PYPROJECT["project"]["license"] == "Apache-2.0"


def test_the_version_has_one_source(built: tuple[str, Path]) -> None:
    meta, _ = metadata(built[1])
    assert meta["Version"] == pawn_queue.__version__
    assert "version" not in PYPROJECT["project"]
    assert "version" in PYPROJECT["project"]["dynamic"]
    assert built[1].name.startswith(f"pawn_queue-{pawn_queue.__version__}-")


def test_links_and_extras(built: tuple[str, Path]) -> None:
    meta, _ = metadata(built[1])
    urls = meta.get_all("Project-URL") or []
    assert urls, "project.urls"
    for entry in urls:
        label, _, url = entry.partition(", ")
        assert label and url.startswith("https://"), entry
    extras = set(meta.get_all("Provides-Extra") or [])
    # The test tools are no user-facing extra.
    assert extras == {"cli", "spark", "metrics", "tracing", "dashboard"}
    spark = [req for req in meta.get_all("Requires-Dist") or [] if 'extra == "spark"' in req]
    assert {re.split(r"[<>=!~ ;\[]", req, maxsplit=1)[0] for req in spark} >= {
        "pyspark",
        "pyarrow",
        "pandas",  # without it Spark's Arrow optimisation of Python UDFs falls back, warning
    }


def test_the_wheel_carries_the_dashboard_files(built: tuple[str, Path]) -> None:
    _, names = metadata(built[1])
    for name in ("templates/base.html", "templates/overview.html", "static/dashboard.js"):
        assert f"pawn_queue/dashboard/{name}" in names


def test_the_test_tools_are_a_dependency_group_the_makefile_installs() -> None:
    assert "dev" not in PYPROJECT["project"].get("optional-dependencies", {})
    dev = PYPROJECT["dependency-groups"]["dev"]
    assert any(req.startswith("pytest") for req in dev)
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert "--group dev" in makefile


def test_readme_says_how_to_install_this_version() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Installation", 1)[1].split("\n## ", 1)[0]
    assert "pip install" in section and "0.1" in section
    assert re.search(r"pawn_queue-[^-\s]+-py3-none-any\.whl", section)
    # Every wheel the README names is this version's.
    wheels = re.findall(r"pawn_queue-([^-\s]+)-py3-none-any\.whl", readme)
    assert set(wheels) == {pawn_queue.__version__}
