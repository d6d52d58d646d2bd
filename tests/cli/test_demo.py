"""The demo deletes nothing it did not create: it refuses a directory that holds something
else, and a re-run clears only what a previous run wrote."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pawn_queue.cli.demo import run_demo
from pawn_queue.cli.demo_dirs import MARKER

REPO = Path(__file__).resolve().parents[2]


def small_demo(directory: Path) -> None:
    run_demo(orders=40, workers=2, directory=directory)


def test_a_fresh_directory_becomes_a_demo_queue(tmp_path: Path) -> None:
    directory = tmp_path / "new" / "queue-demo"
    small_demo(directory)
    assert (directory / MARKER).is_file()
    assert (directory / "orders" / ".topic").is_file()


def test_a_directory_with_other_content_is_refused_untouched(tmp_path: Path) -> None:
    directory = tmp_path / "mine"
    (directory / "orders").mkdir(parents=True)
    (directory / "orders" / "keep.txt").write_text("precious")
    (directory / "notes.txt").write_text("also precious")
    with pytest.raises(SystemExit, match="is not empty") as info:
        small_demo(directory)
    assert str(directory) in str(info.value.code)
    assert (directory / "orders" / "keep.txt").read_text() == "precious"
    assert (directory / "notes.txt").read_text() == "also precious"
    assert sorted(p.name for p in directory.iterdir()) == ["notes.txt", "orders"]


def test_the_current_directory_is_refused_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "work.txt").write_text("unsaved work")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="is not empty"):
        small_demo(Path("."))
    assert [p.name for p in tmp_path.iterdir()] == ["work.txt"]


def test_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(SystemExit, match="not a directory"):
        small_demo(tmp_path / "f")
    assert (tmp_path / "f").read_text() == "x"


def test_an_empty_directory_is_used(tmp_path: Path) -> None:
    directory = tmp_path / "empty"
    directory.mkdir()
    small_demo(directory)
    assert (directory / MARKER).is_file()


def test_a_rerun_clears_only_what_the_demo_wrote(tmp_path: Path) -> None:
    directory = tmp_path / "queue-demo"
    small_demo(directory)
    # Written later by someone else: not the demo's to delete.
    (directory / "notes.txt").write_text("keep")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data").write_text("keep too")
    (directory / "_notify").rename(tmp_path / "old-notify")
    (directory / "_notify").symlink_to(outside)
    # The second run fails (SystemExit) if the first run's dead letters are still there.
    small_demo(directory)
    assert (directory / "notes.txt").read_text() == "keep"
    assert (outside / "data").read_text() == "keep too"
    assert not (directory / "_notify").is_symlink()


def test_the_example_runs_twice_in_a_row(tmp_path: Path) -> None:
    """What ``make demo`` does: examples/demo.py on ./queue-demo, once more on the result."""
    argv = [sys.executable, str(REPO / "examples" / "demo.py"), "--orders", "40", "--workers", "2"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQUEUE_")}
    for _ in range(2):
        done = subprocess.run(
            argv, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=240
        )
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert "processed (acked)" in done.stdout
    assert (tmp_path / "queue-demo" / MARKER).is_file()


def test_the_command_refuses_a_directory_with_other_content(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("x")
    argv = [sys.executable, "-m", "pawn_queue", "demo", "--orders", "10", "--dir", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("error: ") and str(tmp_path) in line
    assert (tmp_path / "precious.txt").read_text() == "x"
