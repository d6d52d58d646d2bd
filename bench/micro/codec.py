"""JSON encode and decode speed: the standard library, orjson, msgspec and pawn-queue's codec
(orjson with the checks that keep the standard library's rules) on the bodies the queue writes
and reads: a message, batch objects of 100 and 1,000 members, a lease, and the Spark read path
(a batch object decoded, each member's payload written again as the ``payload`` column's text).

Each run times every library on every case, one after the other; a figure is the median over
``--runs`` runs, and each speed-up is the median of the ratios to the standard library measured
in the same run. Run from the repository root::

    python -m bench.micro.codec                    # writes bench/results/codec.json
    python -m bench.micro.codec --runs 3 --seconds 0.1
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from bench import common
from pawn_queue._protocol import codec

try:
    import msgspec
except ImportError:  # optional: only measured when installed (the dev group has it)
    msgspec = None


def _stdlib_dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


_STDLIB_TEXT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))

# name -> (dumps to bytes, loads from bytes, payload text for the Spark column)
Codec = tuple[Callable[[Any], bytes], Callable[[bytes], Any], Callable[[Any], str]]
CODECS: dict[str, Codec] = {
    "stdlib": (_stdlib_dumps, json.loads, _STDLIB_TEXT.encode),
    "orjson": (orjson.dumps, orjson.loads, lambda v: orjson.dumps(v).decode()),
    "pawn_queue._protocol.codec": (codec.dumps, codec.loads, codec.text),
}
if msgspec is not None:
    _encoder, _decoder = msgspec.json.Encoder(), msgspec.json.Decoder()
    CODECS["msgspec"] = (
        _encoder.encode,
        _decoder.decode,
        lambda v: _encoder.encode(v).decode(),
    )


def order(n: int, nulls: bool) -> dict[str, Any]:
    """A small order, the kind of payload the examples publish."""
    payload: dict[str, Any] = {
        "order_id": n,
        "customer": f"customer-{n % 97}",
        "amount": round(12.5 + n * 0.37, 2),
        "currency": "EUR",
        "items": [{"sku": "A-100", "qty": 2}, {"sku": "B-7", "qty": 1}],
        "note": "livraison après 18 h",
    }
    if nulls:
        payload["coupon"] = None
    return payload


def message_body(n: int, nulls: bool) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "topic": "orders",
        "producer_id": str(uuid.uuid4()),
        "created_at": datetime.now(UTC).isoformat(),
        "payload": order(n, nulls),
    }


def batch_body(members: int, nulls: bool) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "topic": "orders",
        "producer_id": str(uuid.uuid4()),
        "created_at": datetime.now(UTC).isoformat(),
        "batch": [{"id": str(uuid.uuid4()), "payload": order(n, nulls)} for n in range(members)],
    }


def lease_body() -> dict[str, Any]:
    return {
        "consumer_id": str(uuid.uuid4()),
        "message_id": str(uuid.uuid4()),
        "claimed_at": datetime.now(UTC).isoformat(),
        "expires_at": datetime.now(UTC).isoformat(),
        "nonce": uuid.uuid4().hex,
        "message_key": f"orders/messages/20250101T120000_123456-{uuid.uuid4()}.batch",
        "settled": list(range(0, 100, 3)),
        "receive_count": 2,
    }


def cases(nulls: bool) -> dict[str, dict[str, Any]]:
    return {
        "message": message_body(1, nulls),
        "batch of 100": batch_body(100, nulls),
        "batch of 1000": batch_body(1000, nulls),
        "lease": lease_body(),
    }


def per_op(call: Callable[[], object], seconds: float) -> float:
    """Microseconds per call: the best of a few timed loops lasting ``seconds`` in all."""
    loops = 1
    while True:  # calibrate: a loop long enough to time
        started = time.perf_counter()
        for _ in range(loops):
            call()
        took = time.perf_counter() - started
        if took >= seconds / 20:
            break
        loops *= 4
    best = took / loops
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        for _ in range(loops):
            call()
        best = min(best, (time.perf_counter() - started) / loops)
    return best * 1e6


def spark_path(name: str, data: bytes) -> Callable[[], object]:
    _, loads, text = CODECS[name]

    def decode() -> list[str]:
        body = loads(data)
        return [text(member["payload"]) for member in body["batch"]]

    return decode


def one_run(seconds: float, nulls: bool) -> dict[str, dict[str, float]]:
    """Microseconds per operation, by ``case / operation`` and codec."""
    out: dict[str, dict[str, float]] = {}
    for case, body in cases(nulls).items():
        data = _stdlib_dumps(body)
        for name, (dumps, loads, _) in CODECS.items():
            encode = functools.partial(dumps, body)
            decode = functools.partial(loads, data)
            out.setdefault(f"{case} / encode", {})[name] = per_op(encode, seconds)
            out.setdefault(f"{case} / decode", {})[name] = per_op(decode, seconds)
    data = _stdlib_dumps(batch_body(1000, nulls))
    for name in CODECS:
        out.setdefault("spark read of a batch of 1000", {})[name] = per_op(
            spark_path(name, data), seconds
        )
    return out


def summarise(runs: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, dict[str, float]]]:
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for row in runs[0]:
        summary[row] = {}
        for name in CODECS:
            times = [run[row][name] for run in runs]
            ratios = [run[row]["stdlib"] / run[row][name] for run in runs]
            summary[row][name] = {
                "us": round(statistics.median(times), 2),
                "speedup": round(statistics.median(ratios), 2),
            }
    return summary


def table(summary: dict[str, dict[str, dict[str, float]]], title: str) -> str:
    names = list(CODECS)
    lines = [
        title,
        f"{'case':<34}" + "".join(f"{n:>24}" for n in names),
    ]
    for row, by_codec in summary.items():
        cells = "".join(
            f"{by_codec[n]['us']:>13.1f} us {by_codec[n]['speedup']:>5.2f}x" for n in names
        )
        lines.append(f"{row:<34}{cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs; figures are medians")
    parser.add_argument("--seconds", type=float, default=0.3, help="time per measurement")
    parser.add_argument("--out", type=Path, default=common.RESULTS / "codec.json")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.seconds <= 0:
        parser.error("needs --runs >= 1 and --seconds > 0")

    started = time.perf_counter()
    results = {}
    texts = []
    for nulls, title in (
        (False, "payloads without null"),
        (
            True,
            "payloads with a null (the codec reads its output back to rule out NaN)",
        ),
    ):
        runs = [one_run(args.seconds, nulls) for _ in range(args.runs)]
        results["with_null" if nulls else "without_null"] = summarise(runs)
        texts.append(table(results["with_null" if nulls else "without_null"], title))
    text = "\n\n".join(texts)
    print(text)
    report = {
        "benchmark": "codec",
        **common.host(),
        "versions": {
            "orjson": orjson.__version__,
            "msgspec": msgspec.__version__ if msgspec is not None else None,
        },
        "runs": args.runs,
        "seconds_per_measurement": args.seconds,
        "git": common.git_state(),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "results": results,
        "table": text,
    }
    common.write_results(args.out, report)
    print(f"\nwrote {args.out} in {report['wall_seconds']} s", file=sys.stderr)


if __name__ == "__main__":
    main()
