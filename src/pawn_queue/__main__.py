"""``python -m pawn_queue``: the ``pawn-queue`` command line (needs the ``cli`` extra)."""

from __future__ import annotations


def main() -> None:
    try:
        from pawn_queue.cli.root import main as cli_main
    except ImportError as exc:  # Typer or Rich missing
        raise SystemExit(
            f"pawn-queue: the command line needs the cli extra "
            f"(pip install 'pawn-queue[cli]'): {exc}"
        ) from None
    cli_main()


if __name__ == "__main__":
    main()
