"""The configuration's documentation: every key in the configuration reference and in
config.example.yaml exists, every key is documented, and keys that apply only sometimes say so."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import BaseModel

from pawn_queue._internal.config_sources import model_class_of
from pawn_queue.config import PawnQueueConfig
from tests.helpers.config_support import README_YAML

REPO = Path(__file__).resolve().parents[2]
REFERENCE = (REPO / "docs" / "configuration" / "reference.md").read_text(encoding="utf-8")
EXAMPLE = (REPO / "config.example.yaml").read_text(encoding="utf-8")


def model_paths(model: type[BaseModel] = PawnQueueConfig, prefix: str = "") -> set[str]:
    paths: set[str] = set()
    for name, field in model.model_fields.items():
        section = model_class_of(field.annotation)
        if section is None:
            paths.add(prefix + name)
        else:
            paths |= model_paths(section, f"{prefix}{name}.")
    return paths


def reference_table() -> dict[str, str]:
    """Key path -> what the docs say of it, from the generated configuration reference
    (docs/configuration/reference.md: a ``### `key` { #key }`` heading per key)."""
    rows: dict[str, str] = {}
    for entry in REFERENCE.split("\n### `")[1:]:
        key, _, text = entry.partition("`")
        rows[key] = text.split("\n## ", 1)[0]
    return rows


def documented(path: str, table: dict[str, str]) -> str | None:
    for key, meaning in table.items():
        if key == path or (key.endswith(".*") and path.startswith(key[:-1])):
            return meaning
    return None


def example_entries() -> dict[str, str]:
    """Key path -> its comment (with continuation lines), from config.example.yaml, commented-out
    keys included."""
    entries: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    last = ""
    for raw in EXAMPLE.splitlines():
        if last and re.match(r"^ {20,}# ", raw):  # a comment continued under the last one
            entries[last] += " " + raw.strip().lstrip("#").strip()
            continue
        match = re.match(r"^( *)(?:# ?)?( *)([a-z_0-9]+):(.*)$", raw)
        if match is None:
            last = ""
            continue
        indent = len(match.group(1)) + len(match.group(2))
        key, rest = match.group(3), match.group(4)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([*(name for _, name in stack), key])
        value, _, comment = rest.partition("#")
        if not value.strip():
            stack.append((indent, key))
        entries[path] = comment.strip()
        last = path
    return entries


def test_reference_documents_exactly_the_keys_there_are() -> None:
    table = reference_table()
    for key in table:
        assert key in model_paths() or (
            key.endswith(".*") and any(p.startswith(key[:-1]) for p in model_paths())
        ), f"the reference documents {key}, which is no key"
    missing = [path for path in sorted(model_paths()) if documented(path, table) is None]
    assert missing == [], "keys missing from the configuration reference"


def test_example_file_names_only_real_keys_and_every_section() -> None:
    entries = example_entries()
    leaves = {path for path in entries if path in model_paths()}
    sections = {path for path in entries if path not in model_paths()}
    assert sections <= {
        "s3",
        "azure",
        "filesystem",
        "memory",
        "polling",
        "concurrency",
        "concurrency.csprng_verify",
        "registry",
        "notify",
        "producer",
    }, sections
    top = {path.split(".")[0] for path in model_paths()}
    assert top <= {path.split(".")[0] for path in entries}, "sections missing from the example"
    assert "notify.backfill_interval_seconds" in leaves


def test_documented_yaml_is_the_one_the_tests_load() -> None:
    page = (REPO / "docs" / "configuration" / "index.md").read_text(encoding="utf-8")
    assert README_YAML in page
    example = yaml.safe_load(EXAMPLE)
    assert example == yaml.safe_load(README_YAML)


def test_keys_that_apply_only_sometimes_say_when() -> None:
    table, example = reference_table(), example_entries()
    for text in (table["polling.interval_seconds"], example["polling.interval_seconds"]):
        assert "notify" in text, text  # with change signals on, the backfill interval rules
    for text in (table["polling.jitter_max_ms"], example["polling.jitter_max_ms"]):
        assert "no effect" in text or "ignored" in text, text
    for text in (table["s3.use_ssl"], example["s3.use_ssl"]):
        assert "endpoint_url" in text and ("ignored" in text or "decides" in text), text
    assert "csprng_verify" in documented("concurrency.csprng_verify.jitter_min_ms", table)
    for key in ("polling.lease_refresh_interval_seconds", "concurrency.clock_skew_margin_seconds"):
        assert "visibility timeout when that is less" in table[key]
        assert "of the" in example[key] and "if less" in example[key]
