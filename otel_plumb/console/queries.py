"""What the console's API and pages ask the stores, as plain functions over query parameters:
one place that parses filters and shapes the answers (the report shapes of SPEC)."""

from __future__ import annotations

import datetime
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from otel_plumb.stats import rate
from otel_plumb.store import MAX_PAGE, PAGE, Filters, QueryError, TrajectoryStore

FILTER_KEYS = ("policy", "invariant", "severity", "status", "agent", "service", "key", "trace_id", "source", "run_id")
DAY = 86400.0


def when(value: str | None, name: str) -> float | None:
    """A time parameter: unix seconds, or ISO 8601 (``2026-12-01T10:00:00Z``)."""
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise QueryError(f"{name}: {value!r} is neither unix seconds nor an ISO 8601 time") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.timestamp()


def number(value: str | None, name: str, default: int, lo: int, hi: int) -> int:
    if value is None or value == "":
        return default
    try:
        n = int(value)
    except ValueError:
        raise QueryError(f"{name}: {value!r} is not a whole number") from None
    if not lo <= n <= hi:
        raise QueryError(f"{name} must be between {lo} and {hi}")
    return n


def filters(params: Mapping[str, str]) -> Filters:
    unknown = sorted(set(params) - {*FILTER_KEYS, "since", "until", "limit", "cursor"})
    if unknown:
        raise QueryError(f"unknown parameter {unknown[0]!r} (known: {', '.join((*FILTER_KEYS, 'since', 'until'))})")
    values = {k: params.get(k) or None for k in FILTER_KEYS}
    return Filters(**values, since=when(params.get("since"), "since"), until=when(params.get("until"), "until"))


def trajectories(store: TrajectoryStore, params: Mapping[str, str]) -> dict[str, Any]:
    limit = number(params.get("limit"), "limit", PAGE, 1, MAX_PAGE)
    items, cursor = store.find(filters(params), limit=limit, cursor=params.get("cursor") or None)
    return {"items": items, "next": cursor}


def conformance(store: TrajectoryStore, params: Mapping[str, str], now: float | None = None) -> dict[str, Any]:
    """Per bucket of time: trajectories that held out of those checked, with Wilson 95% bounds."""
    now = time.time() if now is None else now
    until = when(params.get("until"), "until") or now
    since = when(params.get("since"), "since") or until - DAY
    bucket = float(number(params.get("bucket"), "bucket", 3600, 1, 366 * 86400))
    policy, invariant = params.get("policy") or None, params.get("invariant") or None
    rows = store.conformance(since, until, bucket, policy=policy, invariant=invariant)
    return {
        "policy": policy, "invariant": invariant, "since": since, "until": until, "bucket": bucket,
        "buckets": [{"start": r["start"], **rate(r["successes"], r["n"]).as_dict()} for r in rows],
    }  # fmt: skip


def overview(store: TrajectoryStore, since: float) -> dict[str, Any]:
    counts = store.status_counts(since)
    checked = sum(n for s, n in counts.items() if s != "unchecked")
    return {
        "since": since,
        "status": counts,
        "indeterminate_share": counts.get("indeterminate", 0) / checked if checked else None,
        "top_violations": store.top_violations(since),
        "names": store.names(),
    }


def campaign_runs(path: Path) -> list[dict[str, Any]]:
    """The campaign runs in the store file (none when it holds no campaign tables)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT run_id, campaign, status, started_at, finished_at FROM runs ORDER BY started_at DESC LIMIT 200"
        ).fetchall()
    except sqlite3.OperationalError:  # no campaign tables in this file
        return []
    finally:
        db.close()
    keys = ("run_id", "campaign", "status", "started_at", "finished_at")
    return [dict(zip(keys, r, strict=True)) for r in rows]


def campaign_report(path: Path, ref: str) -> dict[str, Any] | None:
    """The campaign report (SPEC's campaign report shape) of one run, or None."""
    from otel_plumb.campaign.reports import build_report
    from otel_plumb.campaign.store import RunNotFound, Store

    store = Store(path, readonly=True)
    try:
        try:
            run = store.run(ref)
        except RunNotFound:
            return None
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):  # a store with no campaign in it
                return None
            raise
        return build_report(store, run)
    finally:
        store.close()


def compare(store: TrajectoryStore, a: str | None, b: str | None) -> dict[str, Any] | None:
    """Two trajectories aligned step by step (Needleman-Wunsch on the tool path, as campaigns
    align them); None when either is not in the store."""
    from otel_plumb.campaign.reports import side_by_side

    if not a or not b:
        raise QueryError("compare needs a and b: two trajectory ids, trace ids or task keys")
    left, right = store.get(a), store.get(b)
    if left is None or right is None:
        return None
    rows = [{"mark": mark, "left": x, "right": y} for mark, x, y in side_by_side(left, right)]
    return {"left": _head(left), "right": _head(right), "rows": rows}


def _head(record: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("id", "trace_id", "key", "agent", "service", "status", "source", "run_id", "arm", "case_id", "variant_id")
    return {k: record.get(k) for k in keys}
