"""Every ```python block of README.md and docs/**/*.md runs as written.

Each block is a complete program, run by a fresh interpreter in a fresh temporary directory
that holds a ``config.yaml`` for a local-directory store and nothing else. A block whose
fence is preceded by the line ``<!-- not run: REASON -->`` is skipped (one that runs until it
is stopped, say); the reason must say why.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.helpers.markdown import REPO, fenced_blocks, markdown_files
from tests.helpers.stores import queue_config_dict

NOT_RUN = re.compile(r"^\s*<!--\s*not run:(?P<reason>.*?)-->\s*$")
PYTHON = frozenset({"python", "py", "python3"})
TIMEOUT_SECONDS = 120


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    code: str
    not_run: str | None  # the reason, when the block is marked not to run

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def python_blocks(path: Path) -> list[Block]:
    """The file's ```python blocks, each with the reason it is not run, if marked so."""
    blocks: list[Block] = []
    for fenced in fenced_blocks(path):
        if fenced.lang in PYTHON:
            marker = NOT_RUN.match(fenced.before)
            reason = marker["reason"] if marker else None
            blocks.append(Block(path, fenced.line, fenced.text, reason))
    return blocks


BLOCKS = [block for path in markdown_files() for block in python_blocks(path)]


def test_the_docs_have_code_to_run() -> None:
    assert len(BLOCKS) >= 3, "python blocks not found: has the fence syntax changed?"
    assert any(block.path.name == "README.md" and block.not_run is None for block in BLOCKS)


def test_every_skipped_block_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    skipped = {
        block.name: (block.not_run or "").strip() for block in BLOCKS if block.not_run is not None
    }
    with capsys.disabled():
        print(
            f"\n{len(BLOCKS) - len(skipped)} python blocks run, {len(skipped)} marked not run:",
            *(f"  {name}: {reason}" for name, reason in skipped.items()),
            sep="\n",
        )
    unexplained = [name for name, reason in skipped.items() if not reason]
    assert unexplained == [], "<!-- not run: REASON --> needs a reason"


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAWNQUEUE_", "AWS_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_python_block_runs_as_written(
    block: Block, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if block.not_run is not None:
        pytest.skip(f"marked not run: {block.not_run.strip()}")
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    config = queue_config_dict("filesystem", request, tmp_path)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    program = tmp_path / "block.py"  # outside the working directory, which holds only config
    program.write_text(block.code, encoding="utf-8")
    try:
        run = subprocess.run(
            [sys.executable, str(program)],
            cwd=workdir,
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired as exc:
        output = [o.decode() if isinstance(o, bytes) else o or "" for o in (exc.stdout, exc.stderr)]
        pytest.fail(
            f"{block.name} ran for {TIMEOUT_SECONDS} s: a block that runs until it is stopped "
            "needs <!-- not run: REASON --> above it\n" + "\n".join(output)
        )
    assert run.returncode == 0, (
        f"{block.name} failed (exit {run.returncode}):\n--- code\n{block.code}"
        f"--- stdout\n{run.stdout}--- stderr\n{run.stderr}"
    )
