"""Every systemd unit in README.md and docs/**/*.md loads as written, and systemd reads in it
the paths that its reader sees.

A unit is a fenced block (any language) with a ``[Unit]``, ``[Service]`` or ``[Install]``
line. ``systemd-analyze verify`` (Debian's ``systemd`` package, which ``make test`` installs)
loads it as systemd would and reports what it refuses or ignores.

verify also refuses a unit whose ``ExecStart`` program is not an executable file, and the
docs' paths (``/srv/shop/...``, ``/etc/shop/...``) are those of the reader's machine, not
this one's. So the test moves every absolute path a path setting starts with (``ExecStart``
and the other ``Exec*``, ``WorkingDirectory``, ``EnvironmentFile``) under a temporary
directory, where it creates what the reader would: the program (an executable script), the
directory, the environment file. The rest of each line is left as the docs have it. Then,
from systemd's own dump of the unit as it loaded it (``SYSTEMD_LOG_LEVEL=debug``), each of
those paths must exist: a comment at the end of a line, which systemd takes as part of the
value, makes a path that does not.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.markdown import REPO, fenced_blocks, markdown_files

SECTION = re.compile(r"^\[(Unit|Service|Install)\]\s*$", re.M)
# A path setting, its prefixes (Exec*'s "@-:+!|", "-" for an optional file, "~" for the
# home directory) and the absolute path it starts with.
PATH_SETTING = re.compile(
    r"^(?P<key>Exec\w+|WorkingDirectory|EnvironmentFile)=(?P<prefix>[-@:+!|~]*)(?P<path>/\S*)",
    re.M,
)
# How `systemd-analyze verify` at debug level dumps those settings of the loaded unit.
DUMPED = re.compile(
    r"^\t+(?:WorkingDirectory|EnvironmentFile): (?P<path>.*?)(?: \(ignore_errors=\w+\))?$"
    r"|^\t+Command Line: (?P<command>\S+)",
    re.M,
)
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


@dataclass(frozen=True)
class Unit:
    path: Path
    line: int  # of the opening fence, 1-based
    text: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def file_name(self) -> str:
        stem = re.sub(r"[^A-Za-z0-9]+", "-", str(self.path.relative_to(REPO).with_suffix("")))
        return f"{stem}-{self.line}.service"


def units(path: Path) -> list[Unit]:
    """The file's fenced blocks that are systemd units."""
    return [Unit(path, b.line, b.text) for b in fenced_blocks(path) if SECTION.search(b.text)]


UNITS = [unit for path in markdown_files() for unit in units(path)]


def test_the_docs_have_a_unit() -> None:
    assert any(unit.path.name == "worker.md" for unit in UNITS), "the worker's unit not found"


def placed(unit: Unit, root: Path) -> str:
    """The unit with its paths under ``root``, where what they name is created."""

    def move(match: re.Match[str]) -> str:
        key, path = match["key"], root / match["path"].lstrip("/")
        if key.startswith("Exec"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("#!/bin/sh\nexit 0\n")
            path.chmod(0o755)
        elif key == "WorkingDirectory":
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("PAWNQUEUE_URL=memory://\n")
        return f"{key}={match['prefix']}{path}"

    return PATH_SETTING.sub(move, unit.text)


def verify(unit_file: Path, debug: bool) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYSTEMD_")}
    # info: what verify reports about a unit (warnings, errors); debug adds the dump.
    env["SYSTEMD_LOG_LEVEL"] = "debug" if debug else "info"
    env["SYSTEMD_LOG_TARGET"] = "console"
    return subprocess.run(
        # --man=no: no man pages to look Documentation= up in; --generators=no: this
        # machine's generators (not run without systemd as PID 1) are none of the unit's.
        [SYSTEMD_ANALYZE, "verify", "--man=no", "--generators=no", str(unit_file)],
        cwd=unit_file.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_the_unit_loads_as_written(unit: Unit, tmp_path: Path) -> None:
    if SYSTEMD_ANALYZE is None:
        reason = "systemd-analyze not found: run 'make test' (it installs Debian's systemd)"
        if os.environ.get("CI"):
            pytest.fail(reason)  # CI installs everything: a skip there would hide a gap
        pytest.skip(reason)
    root = tmp_path / "root"
    unit_file = tmp_path / unit.file_name
    unit_file.write_text(placed(unit, root), encoding="utf-8")

    run = verify(unit_file, debug=False)
    # Lines about the unit name it (its file or its name); the rest is this machine's.
    about = [
        line
        for line in (run.stdout + run.stderr).splitlines()
        if unit_file.name in line or str(unit_file) in line
    ]
    assert run.returncode == 0 and about == [], f"{unit.name}:\n{run.stdout}{run.stderr}"

    dump = verify(unit_file, debug=True).stdout
    paths = [match["path"] or match["command"] for match in DUMPED.finditer(dump)]
    assert len(paths) >= len(PATH_SETTING.findall(unit.text)), dump
    missing = [path for path in paths if not Path(path).exists()]
    assert missing == [], f"{unit.name}: systemd reads paths not written: {missing}"
