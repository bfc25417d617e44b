"""Campaigns with a policy's redaction section: the stored trajectories carry no redacted value,
and every figure of the report is the one an unredacted run gives (argument comparisons use keyed
hashes, so consistency and divergences stay exact)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from test_campaign_run import FAULTS, PY_ARMS, run_once, setup_campaign

from otel_plumb.campaign.store import Store

VENDORS = ("Acme Supplies", "Birch Logistics", "Cobalt Tools")
REDACTION = "redaction:\n  paths:\n    - {path: vendor, action: hash}\n"


def figures(report: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for arm, data in report["arms"].items():
        for name, p in data["perturbations"].items():
            out[(arm, name)] = (
                p["critical_conformance"]["rate"],
                p["consistency"]["structural"]["rate"],
                p["outcome_agreement"]["rate"],
                sorted((d["kind"], d["tool"]) for d in p["divergences"]),
            )
    return out


def every_value(db_path: Path) -> str:
    """Every text value of every table of a store (trajectories, trial summaries, the cache)."""
    db = sqlite3.connect(db_path)
    try:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return "\n".join(
            str(value) for table in tables for row in db.execute(f"SELECT * FROM {table}") for value in row
        )
    finally:
        db.close()


async def _campaign(tmp_path: Path, redact: bool) -> tuple[dict[str, Any], Store]:
    tmp_path.mkdir()
    path = setup_campaign(tmp_path, PY_ARMS, FAULTS, cases=3)
    if redact:
        policy = tmp_path / "ap.yaml"
        text = policy.read_text()
        policy.write_text(text.replace("invariants:\n", REDACTION + "invariants:\n", 1))
    store = Store(tmp_path / "runs.db")
    return await run_once(path, store), store


@pytest.mark.parametrize("key", ["", "0123456789abcdef0123456789abcdef"])
async def test_a_redacted_campaign_stores_no_secret_and_reports_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    if key:
        monkeypatch.setenv("PLUMB_REDACTION_KEY", key)
    plain, _ = await _campaign(tmp_path / "plain", redact=False)
    redacted, store = await _campaign(tmp_path / "redacted", redact=True)
    assert figures(redacted) == figures(plain)

    stored = [store.trajectory(redacted["run_id"], t["trial_id"]) for t in redacted["trials"]]
    # Argument keys are normalised (lower-cased): look for any case.
    text = (json.dumps(redacted) + every_value(tmp_path / "redacted" / "runs.db")).lower()
    assert not [v for v in VENDORS if v.lower() in text]
    vendor_args = [
        s["args"]["vendor"] for r in stored for s in r["steps"] if s["name"] == "check_vendor_status" and s["args"]
    ]
    assert vendor_args and all(v.startswith("[hmac:") for v in vendor_args)
    # Without redaction the vendors are stored (so the check above could fail).
    assert any(v in every_value(tmp_path / "plain" / "runs.db") for v in VENDORS)
