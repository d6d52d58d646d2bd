"""The documentation site: it builds with ``mkdocs build --strict`` (a broken link, a page
missing from the nav or an API reference that does not resolve fails), the configuration
reference is the one generated from the config model, and the README stays a short front
door whose links lead somewhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from pawn_queue.config import ENV_ALIASES, ENV_NAMES
from tests.helpers.config_reference import (
    COMMAND,
    MEANINGS,
    config_keys,
    config_reference,
    description,
)

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "configuration" / "reference.md"
README = REPO / "README.md"


def test_the_site_builds_strict(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQUEUE_")}
    env["NO_MKDOCS_2_WARNING"] = "1"  # Material's notice about MkDocs 2.0, not a problem here
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    problems = [line for line in run.stderr.splitlines() if not line.startswith("INFO")]
    assert run.returncode == 0, "\n".join(problems)
    assert (tmp_path / "index.html").is_file()
    assert (tmp_path / "configuration" / "reference" / "index.html").is_file()
    api = (tmp_path / "api" / "index.html").read_text(encoding="utf-8")
    assert 'id="pawn_queue.PawnQueue"' in api, "the API reference lost PawnQueue"
    changelog = (tmp_path / "changelog" / "index.html").read_text(encoding="utf-8")
    assert "Unreleased" in changelog, "CHANGELOG.md is not included"
    # The home page shows the comparison with SQS, Kafka, Celery and a database queue that
    # it speaks of (the README's table, included), not a pointer to a file off the site.
    home = (tmp_path / "index.html").read_text(encoding="utf-8")
    headers = [
        re.findall(r"<th>(.*?)</th>", head)
        for head in re.findall(r"<thead>.*?</thead>", home, re.S)
    ]
    assert any({"Amazon SQS", "Kafka", "Celery"} <= set(row) for row in headers), headers


def test_the_configuration_reference_is_up_to_date() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == config_reference(), (
        f"docs/configuration/reference.md is out of date: run `{COMMAND}`"
    )


def test_the_configuration_reference_names_every_key_and_variable() -> None:
    reference = REFERENCE.read_text(encoding="utf-8")
    keys = config_keys()
    assert set(keys) == set(ENV_NAMES.values())
    missing = [key for key in keys if f"### `{key}` {{ #{key} }}\n" not in reference]
    assert missing == [], "keys missing from the configuration reference"
    variables = [name for name in (*ENV_NAMES, *ENV_ALIASES) if f"`{name}`" not in reference]
    assert variables == [], "variables missing from the configuration reference"


def test_every_key_says_what_it_means() -> None:
    """From the model (a field's description or attribute docstring) or, failing that, from
    tests/helpers/config_reference.py's MEANINGS."""
    undescribed = [key for key in config_keys() if not description(key)]
    assert undescribed == [], "describe these keys in the model or in MEANINGS"
    stale = sorted(set(MEANINGS) - set(config_keys()))
    assert stale == [], "MEANINGS describes keys there are not"


def test_the_readme_is_a_short_front_door() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    for needed in ("make demo", "make test", "## Installation", "## Quick start", "s3:"):
        assert needed in text, needed


def test_the_readme_links_lead_to_files_there_are() -> None:
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link.split("#", 1)[0] for link in links if "://" not in link]
    assert local, "no links into the docs"
    missing = [link for link in local if not (REPO / link).exists()]
    assert missing == [], "the README links to files that do not exist"
