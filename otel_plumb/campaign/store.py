"""The SQLite run store: runs, variants, trials, trajectories, verdicts, and the answer cache.

Each trial is committed as it finishes, so an interrupted run resumes where it stopped.
Analyses read the compact per-trial summary columns, never the full trajectory records.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from otel_plumb.campaign.perturb import Discard, Variant
from otel_plumb.store import TrajectoryStore

DEFAULT_STORE = Path(".otel-plumb") / "runs.db"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, campaign TEXT NOT NULL, config_path TEXT NOT NULL, config_json TEXT NOT NULL,
  seed INTEGER NOT NULL, arms_json TEXT NOT NULL, status TEXT NOT NULL, parent_run TEXT,
  started_at REAL NOT NULL, finished_at REAL, note TEXT
);
CREATE TABLE IF NOT EXISTS variants (
  run_id TEXT NOT NULL, variant_id TEXT NOT NULL, case_id TEXT NOT NULL, perturbation TEXT NOT NULL,
  steps_json TEXT NOT NULL, PRIMARY KEY (run_id, variant_id)
);
CREATE TABLE IF NOT EXISTS discards (
  run_id TEXT NOT NULL, case_id TEXT NOT NULL, perturbation TEXT NOT NULL, reason TEXT NOT NULL, detail_json TEXT
);
CREATE TABLE IF NOT EXISTS trials (
  run_id TEXT NOT NULL, trial_id TEXT NOT NULL, identity TEXT NOT NULL, arm TEXT NOT NULL, case_id TEXT NOT NULL,
  variant_id TEXT NOT NULL, perturbation TEXT NOT NULL, rep INTEGER NOT NULL, trace_id TEXT, status TEXT NOT NULL,
  error TEXT, answer_json TEXT, traj_status TEXT, critical_ok INTEGER, summary_json TEXT, cached INTEGER NOT NULL,
  duration_ms REAL, PRIMARY KEY (run_id, trial_id)
);
CREATE TABLE IF NOT EXISTS trajectories (
  run_id TEXT NOT NULL, trial_id TEXT NOT NULL, record_json TEXT NOT NULL, PRIMARY KEY (run_id, trial_id)
);
CREATE TABLE IF NOT EXISTS verdicts (
  run_id TEXT NOT NULL, trial_id TEXT NOT NULL, policy TEXT, invariant TEXT NOT NULL, verdict TEXT NOT NULL,
  severity TEXT NOT NULL, step_index INTEGER
);
CREATE INDEX IF NOT EXISTS verdicts_by_trial ON verdicts (run_id, trial_id);
CREATE TABLE IF NOT EXISTS answer_cache (
  identity TEXT PRIMARY KEY, answer_json TEXT NOT NULL, trace_id TEXT, record_json TEXT, created_at REAL NOT NULL
);
"""


@dataclass(slots=True)
class RunInfo:
    run_id: str
    campaign: str
    config_path: str
    config: dict[str, Any]
    seed: int
    arms: list[str]
    status: str
    parent_run: str | None
    started_at: float
    finished_at: float | None


@dataclass(slots=True)
class TrialRow:
    trial_id: str
    identity: str
    arm: str
    case_id: str
    variant_id: str
    perturbation: str
    rep: int
    trace_id: str | None = None
    status: str = "pending"  # "ok" (answer and trajectory), "error"
    error: str | None = None
    answer: dict[str, Any] | None = None
    traj_status: str | None = None
    critical_ok: bool | None = None
    # {"path": [[name, step_index, args], ...] (succeeded tool steps), "violations": [...]}
    summary: dict[str, Any] | None = None
    cached: bool = False
    duration_ms: float | None = None


class RunNotFound(LookupError):
    pass


class Store:
    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self.path = Path(path)
        if readonly:
            # For the console, which never writes: not even the schema or the journal mode.
            self.decided = TrajectoryStore(self.path, readonly=True)
            self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        # Trial trajectories also go to the console's tables in the same file, beside live
        # traffic and replays.
        self.decided = TrajectoryStore(self.path)

    def close(self) -> None:
        self.decided.close()
        self.db.close()

    # runs
    def create_run(self, campaign: str, config_path: str, config: dict[str, Any], seed: int, arms: list[str],
                   parent_run: str | None = None, note: str | None = None) -> str:
        run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
        self.db.execute(
            "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (run_id, campaign, config_path, json.dumps(config, default=str), seed, json.dumps(arms), "running",
             parent_run, time.time(), None, note),
        )
        return run_id

    def run(self, ref: str) -> RunInfo:
        """A run by id, unique id prefix, or ``latest``."""
        if ref == "latest":
            row = self.db.execute("SELECT * FROM runs ORDER BY started_at DESC LIMIT 1").fetchone()
        else:
            rows = self.db.execute("SELECT * FROM runs WHERE run_id = ? OR run_id LIKE ?",
                                   (ref, ref.replace("%", "") + "%")).fetchall()
            exact = [r for r in rows if r[0] == ref]
            if len(rows) > 1 and not exact:
                raise RunNotFound(f"run {ref!r} is ambiguous: {', '.join(r[0] for r in rows[:5])}")
            row = exact[0] if exact else (rows[0] if rows else None)
        if row is None:
            raise RunNotFound(f"no run {ref!r} in {self.path}")
        return RunInfo(row[0], row[1], row[2], json.loads(row[3]), row[4], json.loads(row[5]), row[6], row[7],
                       row[8], row[9])

    def set_status(self, run_id: str, status: str) -> None:
        finished = time.time() if status != "running" else None
        self.db.execute("UPDATE runs SET status = ?, finished_at = ? WHERE run_id = ?", (status, finished, run_id))

    # variants
    def save_variants(self, run_id: str, variants: list[Variant], discards: list[Discard]) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany("INSERT OR REPLACE INTO variants VALUES (?,?,?,?,?)", [
                (run_id, v.variant_id, v.case_id, v.perturbation, json.dumps(v.steps)) for v in variants])
            self.db.executemany("INSERT INTO discards VALUES (?,?,?,?,?)", [
                (run_id, d.case_id, d.perturbation, d.reason, json.dumps(d.detail, default=str)) for d in discards])

    def variants(self, run_id: str) -> list[Variant]:
        rows = self.db.execute("SELECT variant_id, case_id, perturbation, steps_json FROM variants WHERE run_id = ? "
                               "ORDER BY rowid", (run_id,))
        return [Variant(r[0], r[1], r[2], json.loads(r[3])) for r in rows]

    def discards(self, run_id: str) -> list[Discard]:
        rows = self.db.execute("SELECT case_id, perturbation, reason, detail_json FROM discards WHERE run_id = ?",
                               (run_id,))
        return [Discard(r[0], r[1], r[2], json.loads(r[3] or "{}")) for r in rows]

    # trials
    def finished_trial_ids(self, run_id: str) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT trial_id FROM trials WHERE run_id = ?", (run_id,))}

    def save_trial(self, run_id: str, t: TrialRow, record: dict[str, Any] | None) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute(
                "INSERT OR REPLACE INTO trials VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (run_id, t.trial_id, t.identity, t.arm, t.case_id, t.variant_id, t.perturbation, t.rep, t.trace_id,
                 t.status, t.error, json.dumps(t.answer, default=str) if t.answer is not None else None,
                 t.traj_status, None if t.critical_ok is None else int(t.critical_ok),
                 json.dumps(t.summary, default=str) if t.summary is not None else None, int(t.cached),
                 t.duration_ms),
            )
            if record is not None:
                self.db.execute("INSERT OR REPLACE INTO trajectories VALUES (?,?,?)",
                                (run_id, t.trial_id, json.dumps(record, default=str)))
                self.db.execute("DELETE FROM verdicts WHERE run_id = ? AND trial_id = ?", (run_id, t.trial_id))
                self.db.executemany("INSERT INTO verdicts VALUES (?,?,?,?,?,?,?)", [
                    (run_id, t.trial_id, v.get("policy"), v["invariant"], v["verdict"], v["severity"],
                     v.get("step_index")) for v in record.get("verdicts", [])])
        if record is not None:
            self.decided.add([{**record, "trial_id": t.trial_id}], "campaign", run_id)

    def trials(self, run_id: str) -> Iterator[TrialRow]:
        rows = self.db.execute(
            "SELECT trial_id, identity, arm, case_id, variant_id, perturbation, rep, trace_id, status, error, "
            "answer_json, traj_status, critical_ok, summary_json, cached, duration_ms FROM trials WHERE run_id = ? "
            "ORDER BY rowid", (run_id,))
        loads = orjson.loads
        for r in rows:
            yield TrialRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9],
                           loads(r[10]) if r[10] else None, r[11], None if r[12] is None else bool(r[12]),
                           loads(r[13]) if r[13] else None, bool(r[14]), r[15])

    def trajectory(self, run_id: str, trial_id: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT record_json FROM trajectories WHERE run_id = ? AND trial_id = ?",
                              (run_id, trial_id)).fetchone()
        return json.loads(row[0]) if row else None

    # answer cache: keyed by trial identity, never by request content alone
    def cache_get(self, identity: str) -> tuple[dict[str, Any], str | None, dict[str, Any] | None] | None:
        row = self.db.execute("SELECT answer_json, trace_id, record_json FROM answer_cache WHERE identity = ?",
                              (identity,)).fetchone()
        if row is None:
            return None
        return json.loads(row[0]), row[1], json.loads(row[2]) if row[2] else None

    def cache_put(self, identity: str, answer: dict[str, Any], trace_id: str | None,
                  record: dict[str, Any] | None) -> None:
        self.db.execute("INSERT OR REPLACE INTO answer_cache VALUES (?,?,?,?,?)",
                        (identity, json.dumps(answer, default=str), trace_id,
                         json.dumps(record, default=str) if record is not None else None, time.time()))
