"""The configuration reference page, generated from the config model:
``python -m tests.helpers.config_reference > docs/configuration/reference.md``
(tests/docs/test_docs_site.py checks the page is up to date and names every key).

Every section and key of :class:`~pawn_queue.config.PawnQueueConfig`, with its type, default,
constraints, ``PAWNQUEUE_*`` variable (and older names) and description. A key's description
is its ``Field(description=...)``, else its attribute docstring (a string right after the
field), else the comment on the field's line or the comment lines right above it. The types
and defaults are rendered as in docs/environment.md (tests.helpers.environment_table).
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from pawn_queue._internal.config_sources import model_class_of
from pawn_queue.config import ENV_ALIASES, ENV_NAMES, URL_ENV_VAR, PawnQueueConfig
from tests.helpers.environment_table import _default, _type

COMMAND = "python -m tests.helpers.config_reference > docs/configuration/reference.md"
ENV_NAMES_BY_PATH = {path: name for name, path in ENV_NAMES.items()}

# What each key means, for the keys whose field in the model has no description or attribute
# docstring of its own (those win). A key added to the model needs one here or there:
# tests/docs/test_docs_site.py fails on a key without a description, and on an entry here for
# a key there is not. Links are relative to docs/configuration/reference.md.
MEANINGS: dict[str, str] = {
    "backend": "Which store: `s3`, `azure`, `filesystem` or `memory`. When not set, the one "
    "store section given decides (with none, `s3`).",
    "s3.endpoint_url": "`http(s)://host[:port]` of the S3-compatible service; its scheme "
    "decides TLS. Not set: AWS.",
    "s3.bucket_name": "The bucket: a valid S3 bucket name.",
    "s3.prefix": "A key prefix, so several queues share a bucket.",
    "s3.aws_access_key_id": "A secret, never shown in repr, logs or errors. Both keys or "
    "neither, and a session token only with them (see [Credentials](index.md#credentials)).",
    "s3.aws_secret_access_key": "A secret, never shown in repr, logs or errors. Both keys or "
    "neither (see [Credentials](index.md#credentials)).",
    "s3.aws_session_token": "A secret, never shown: temporary credentials' token, only with "
    "both keys (see [Credentials](index.md#credentials)).",
    "s3.region_name": "The bucket's region (the request signature names it).",
    "s3.use_ssl": "Accepted from 0.1 configs: the `endpoint_url`'s scheme decides TLS (AWS: "
    "always TLS), and a `use_ssl` that contradicts it is ignored with a warning.",
    "s3.verify_ssl": "`false` accepts any TLS certificate.",
    "s3.addressing_style": "`path` (`host/bucket/key`) or `virtual` (the bucket as host name).",
    "s3.connect_timeout_seconds": "How long connecting may take.",
    "s3.request_timeout_seconds": "Covers a whole transfer, so it must fit the largest "
    "payload. Lease requests have shorter bounds of their own that follow the visibility "
    "timeout, so a stalled one never outlasts its lease (rule 11 in the "
    "[protocol](../protocol.md#correctness-rules)).",
    "s3.max_retries": "Retries of transient failures, with backoff. A publish whose answer "
    "was lost is written again only after a look found it missing "
    "([protocol](../protocol.md#publish)).",
    "s3.retry_timeout_seconds": "How long the retries of one request may take in all.",
    "s3.throttle_timeout_seconds": "How long a request the store refuses for its request "
    "rate (HTTP 429, 503 `SlowDown`) is sent again, after pauses from 1 s doubling to 16 s, "
    "before the caller gets `StoreThrottledError` "
    "([protocol](../protocol.md#request-rates)).",
    "azure.container_name": "An existing container: 3-63 lowercase letters, digits and "
    "single hyphens.",
    "azure.prefix": "A key prefix, so several queues share a container.",
    "azure.account_name": "The storage account; required unless `use_emulator` "
    "(`devstoreaccount1`).",
    "azure.account_key": "A secret, never shown: key1 or key2 (base64). Without it, the "
    "Azure client's own credential chain (see [Credentials](index.md#credentials)).",
    "azure.endpoint_url": "`http(s)://host[:port][/path]`; not set: "
    "`https://<account>.blob.core.windows.net`. Azurite serves an account at "
    "`http://127.0.0.1:10000/<account>`.",
    "azure.use_emulator": "`true`: Azurite's defaults for what is not set (account "
    "`devstoreaccount1` and its published key, endpoint `http://127.0.0.1:10000`, the "
    "account appended to an `endpoint_url` without a path).",
    "azure.connect_timeout_seconds": "As `s3.connect_timeout_seconds`.",
    "azure.request_timeout_seconds": "As `s3.request_timeout_seconds`.",
    "azure.max_retries": "As `s3.max_retries`.",
    "azure.retry_timeout_seconds": "As `s3.retry_timeout_seconds`.",
    "azure.throttle_timeout_seconds": "As `s3.throttle_timeout_seconds` (Azure answers 503 "
    "`ServerBusy`).",
    "filesystem.path": "The directory, created with its parents by the first write.",
    "memory.name": 'Stores with the same name are shared within a process; `""`: a fresh store.',
    "polling.interval_seconds": "With change signals off (`notify.enabled: false`), how long "
    "an idle consumer (`listen()`, `poll(wait=...)`) waits between full polls; with them on "
    "(the default), `notify.backfill_interval_seconds` takes its place.",
    "polling.max_messages_per_poll": "The most messages one `poll()` returns.",
    "polling.visibility_timeout_seconds": "A lease's lifetime. A claim whose requests take "
    "longer than half of it, or a refresh or release taking longer than a quarter (or past "
    "the lease's last safety window), is given up and its outcome read back.",
    "polling.lease_refresh_interval_seconds": "How often held leases are refreshed. Not set: "
    "10, or a third of the visibility timeout when that is less; when set, it must be "
    "shorter than the visibility timeout.",
    "polling.jitter_max_ms": "Accepted from 0.1 configs and ignored (0.1 did not use it "
    "either); the claim jitter of `csprng_verify` is "
    "`concurrency.csprng_verify.jitter_min_ms` / `jitter_max_ms`.",
    "polling.shutdown_grace_seconds": "How long a stopping `listen()` (cancel, Ctrl-C, "
    "SIGTERM) lets running handlers finish before it releases their messages.",
    "concurrency.strategy": "`auto` probes an S3 or Azure store at `setup()` and takes its "
    "answer; `conditional_write` is probed too and refused where the store does not enforce "
    "it; a local directory and memory enforce conditional writes (no probe). See "
    "[strategies](../concepts/strategies.md).",
    "concurrency.csprng_verify.jitter_min_ms": "Only with the `csprng_verify` strategy: the "
    "shortest sleep after writing a lease, before verifying it.",
    "concurrency.csprng_verify.jitter_max_ms": "Only with the `csprng_verify` strategy: the "
    "longest sleep after writing a lease, before verifying it.",
    "concurrency.csprng_verify.verify_retries": "Only with the `csprng_verify` strategy: how "
    "many more HEADs check the lease after the first.",
    "concurrency.csprng_verify.verify_retry_delay_ms": "Only with the `csprng_verify` "
    "strategy: the pause between those HEADs.",
    "concurrency.clock_skew_margin_seconds": "How far apart consumers' clocks may be without "
    "a live lease looking expired. Not set: 2, or a quarter of the visibility timeout when "
    "that is less; when set, it must be shorter than the visibility timeout.",
    "registry.heartbeat_interval_seconds": "How often each process rewrites its record in "
    "`_registry/instances/` (one PUT per process, whatever its number of consumers); "
    "liveness is judged on two intervals.",
    "notify.enabled": "Change signals: producers write `_notify/_`, idle consumers watch it "
    "([change signals](../concepts/change-signals.md)).",
    "notify.check_interval_seconds": "How often an idle process HEADs `_notify/_` (one "
    "request, whatever the number of topics). Where other processes change it less often "
    "than every four checks, the checks are spaced to a quarter of the shortest of its last "
    "three gaps between changes, up to `idle_check_interval_seconds`: a message of a "
    "trickle costs four checks, not one per interval.",
    "notify.idle_check_interval_seconds": "The check slows down to this after 10 s without a "
    "change: an idle consumer hears of a publish from another process within about this "
    "long.",
    "notify.backfill_interval_seconds": "An idle consumer's wait on the signals ends at "
    "least this often, and it polls (which lists only what a signal or a due time calls "
    "for); with signals off, `polling.interval_seconds` is used. 0.2.0 also listed "
    "`_notify/` this often.",
    "notify.sweep_interval_seconds": "Each topic an idle process consumes is listed at least "
    "this often, signal or not.",
    "notify.sweep_pace_seconds": "Those sweeps list one topic at most this often, whatever "
    "the number of topics.",
    "notify.slot_signals": "Also write each signalled topic's slot `_notify/{slot}`, as "
    "0.2.0 did: set it on producers while consumers of 0.2.0 run on the bucket (they "
    "read the slots; without them they find new messages only by their sweep) "
    "([request rates](../protocol.md#request-rates)).",
    "notify.signal_interval_seconds": "A change signal (a version of the signal log) is "
    "written at most this often by every producer process together, each version at the "
    "next of 16 keys: each key at most once per 16 intervals (1.6 s at the default), within "
    "the one write a second per key of Google Cloud Storage, Cloudflare R2 and Storj. "
    "Longer: fewer requests while busy, a later wake-up for other processes' consumers "
    "([request rates](../protocol.md#request-rates)).",
    "notify.shared_check_interval_seconds": "Where several consumer processes share a "
    "queue (the registry says which), each checks the signals that many times less often, "
    "up to this: together they check as often as one process, and a new message waits for "
    "its owner's next check. Set it to `check_interval_seconds` for the fastest wake-up "
    "in a fleet, at one request per check per process "
    "([request rates](../protocol.md#request-rates)).",
    "producer.group_commit": "Concurrent `publish()` calls to one topic share batch objects "
    "(a lone publish is written at once, alone); `false`: one object per message, as a "
    "fleet with pawn-queue 0.1 consumers needs (0.1 skips batch objects).",
    "producer.linger_seconds": "How long a write waits for more publishes to join it.",
    "producer.max_batch_messages": "The most messages one group-commit object holds.",
    "producer.max_batch_bytes": "The most encoded bytes one group-commit object holds; a "
    "larger message is written alone.",
}
ROLE = re.compile(r":(?:py:)?(?P<role>[a-z]+):`(?P<tilde>~?)(?P<target>[^`]+)`")


def markdown(docstring: str) -> str:
    """A docstring's reST as Markdown: roles as code, ``::`` as ``:``, one paragraph a line."""

    def role(match: re.Match[str]) -> str:
        target = match["target"]
        shown = target.rsplit(".", 1)[-1] if match["tilde"] else target
        return f"`{shown}{'()' if match['role'] in ('func', 'meth') else ''}`"

    text = ROLE.sub(role, inspect.cleandoc(docstring))
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    text = re.sub(r"(\S)::$", r"\1:", text, flags=re.M)
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
    return "\n\n".join(paragraphs)


def field_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> its ``Field(description=...)``, else its attribute docstring (a string
    right after the field in the class's source)."""
    found = {
        name: markdown(field.description)
        for name, field in model.model_fields.items()
        if field.description
    }
    [cls] = ast.parse(textwrap.dedent(inspect.getsource(model))).body
    assert isinstance(cls, ast.ClassDef)
    for node, following in zip(cls.body, [*cls.body[1:], None], strict=True):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            found.setdefault(node.target.id, markdown(following.value.value))
    return found


def description(path: str) -> str:
    """What a key means: the model's own words (a description or attribute docstring) when it
    has them, else MEANINGS."""
    *sections, name = path.split(".")
    model: Any = PawnQueueConfig
    for section in sections:
        model = model_class_of(model.model_fields[section].annotation)
    return field_docstrings(model).get(name) or MEANINGS.get(path, "")


def constraints(field: FieldInfo) -> str:
    shown = []
    for item in field.metadata:
        if isinstance(item, annotated_types.Gt):
            shown.append(f"> {item.gt}")
        elif isinstance(item, annotated_types.Ge):
            shown.append(f"≥ {item.ge}")
        elif isinstance(item, annotated_types.Lt):
            shown.append(f"< {item.lt}")
        elif isinstance(item, annotated_types.Le):
            shown.append(f"≤ {item.le}")
        elif isinstance(item, annotated_types.MinLen):
            shown.append(f"at least {item.min_length} character{'s' * (item.min_length != 1)}")
        elif isinstance(item, annotated_types.MaxLen):
            shown.append(f"at most {item.max_length} characters")
    return ", ".join(shown)


def _key(path: str, field: FieldInfo, description: str, aliases: list[str]) -> list[str]:
    variable = f"`{ENV_NAMES_BY_PATH[path]}`"
    if aliases:
        variable += " (also read as " + ", ".join(f"`{a}`" for a in aliases) + ")"
    kind = _type(field.annotation).replace(" \\| ", " or ")  # a table's escape, not needed
    limits = constraints(field)
    lines = [
        "",
        f"### `{path}` {{ #{path} }}",
        "",
        f"- type: {kind}" + (f", {limits}" if limits else ""),
        f"- default: {_default(field)}",
        f"- variable: {variable}",
    ]
    return [*lines, "", description] if description else lines


def _section(model: type[BaseModel], prefix: str, optional: bool, out: list[str]) -> None:
    aliases: dict[str, list[str]] = {}
    for alias, path in ENV_ALIASES.items():
        aliases.setdefault(path, []).append(alias)
    out += ["", f"## `{prefix.rstrip('.')}`" if prefix else "## Top level", ""]
    if not prefix:
        out += [
            f"The store may also be given as a URL, in `{URL_ENV_VAR}` (or",
            "`PawnQueue.from_url`): it selects the store and its options, and the variables",
            "below override its values.",
        ]
    else:
        if model.__doc__:
            out += [markdown(model.__doc__)]
        if optional:
            out += ["", "An optional section: give it only for the store it describes."]
    subsections = []
    for name, field in model.model_fields.items():
        section = model_class_of(field.annotation)
        if section is not None:
            subsections.append((name, field, section))
            continue
        path = prefix + name
        out += _key(path, field, description(path), aliases.get(path, []))
    for name, field, section in subsections:
        _section(section, f"{prefix}{name}.", field.default is None, out)


def config_reference() -> str:
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated from the configuration model: do not edit. Regenerate with",
        f"     {COMMAND} -->",
        "",
        "Every key of the configuration, generated from the configuration model",
        "(`pawn_queue.config.PawnQueueConfig` and its sections), so it cannot drift from the",
        "code. A key is written in `config.yaml` under its section (`polling.interval_seconds`",
        "is `interval_seconds:` under `polling:`), or set with its variable; a value that is",
        "not allowed is refused with a `ConfigError` naming the key. Where a key has older",
        "variable names that are still read, they follow its variable;",
        "[Environment variables](../environment.md) lists them all in one table. Regenerate",
        f"this page with `{COMMAND}`.",
    ]
    _section(PawnQueueConfig, "", False, out)
    return "\n".join(out) + "\n"


def config_keys() -> list[str]:
    """Every key of the configuration, as a dotted path."""
    keys: list[str] = []

    def walk(model: Any, prefix: str) -> None:
        for name, field in model.model_fields.items():
            section = model_class_of(field.annotation)
            if section is None:
                keys.append(prefix + name)
            else:
                walk(section, f"{prefix}{name}.")

    walk(PawnQueueConfig, "")
    return keys


if __name__ == "__main__":
    print(config_reference(), end="")
