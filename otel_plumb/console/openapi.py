"""The OpenAPI 3.1 description of the console's read-only API, served at ``/api/v1/openapi.json``.
Record shapes are SPEC's report shapes (a trajectory record as in report JSON ``trajectories[]``,
a campaign report as ``campaign run --json`` writes it)."""

from __future__ import annotations

from typing import Any

from otel_plumb.model import SEVERITIES
from otel_plumb.store import MAX_PAGE, PAGE
from otel_plumb.store.db import SOURCES


def _param(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": schema or {"type": "string"}}  # fmt: skip


_TIME = {"type": "string", "description": "unix seconds or ISO 8601"}
_FILTERS = [
    _param("policy", "trajectories with a verdict of this policy"),
    _param("invariant", "trajectories that failed this invariant"),
    _param("severity", "trajectories with a failed verdict of at least this severity",
           {"type": "string", "enum": list(SEVERITIES)}),
    _param("status", "trajectory status",
           {"type": "string", "enum": ["conformant", "violating", "indeterminate", "unchecked"]}),
    _param("agent", "agent name"),
    _param("service", "service.name"),
    _param("key", "task key (e.g. an invoice id)"),
    _param("trace_id", "trace id (hex)"),
    _param("source", "where the record came from", {"type": "string", "enum": list(SOURCES)}),
    _param("run_id", "the replay or campaign run"),
    _param("since", "decided at or after", _TIME),
    _param("until", "decided before", _TIME),
    _param("limit", f"page size (default {PAGE})", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}),
    _param("cursor", "the `next` of the previous page"),
]  # fmt: skip

def _ok(ref: str, description: str) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{ref}"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERROR = _ok("Error", "bad parameter")
_NOT_FOUND = _ok("Error", "not in this store")
_REF = "store id, trace id or task key"


_RATE = {
    "type": "object",
    "required": ["successes", "n", "rate", "lo", "hi"],
    "properties": {
        "successes": {"type": "integer"}, "n": {"type": "integer"}, "rate": {"type": ["number", "null"]},
        "lo": {"type": "number"}, "hi": {"type": "number"},
    },
}  # fmt: skip

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "otel-plumb console API", "version": "1",
             "description": "Read-only access to decided trajectories, conformance and campaign runs."},
    "paths": {
        "/api/v1/trajectories": {"get": {
            "summary": "List trajectories, newest first, keyset-paginated", "parameters": _FILTERS,
            "responses": {"200": _ok("TrajectoryPage", "a page"), "400": _ERROR}}},
        "/api/v1/trajectories/{ref}": {"get": {
            "summary": "One trajectory with its steps and verdicts",
            "parameters": [{"name": "ref", "in": "path", "required": True, "schema": {"type": "string"},
                            "description": "store id, trace id or task key (the newest match)"}],
            "responses": {"200": _ok("Trajectory", "the trajectory record"), "404": _NOT_FOUND}}},
        "/api/v1/conformance": {"get": {
            "summary": "Conformance over time with Wilson 95% bounds",
            "parameters": [_param("policy", "one policy"), _param("invariant", "one invariant"),
                           _param("since", "start (default: a day before until)", _TIME),
                           _param("until", "end (default: now)", _TIME),
                           _param("bucket", "bucket width in seconds (default 3600)",
                                  {"type": "integer", "minimum": 1})],
            "responses": {"200": _ok("Conformance", "buckets"), "400": _ERROR}}},
        "/api/v1/overview": {"get": {
            "summary": "Status counts, indeterminate share, top violated invariants, names for filters",
            "parameters": [_param("since", "start (default: a day ago)", _TIME)],
            "responses": {"200": _ok("Overview", "the overview"), "400": _ERROR}}},
        "/api/v1/campaigns": {"get": {
            "summary": "Campaign runs in the store", "responses": {"200": _ok("CampaignRuns", "runs")}}},
        "/api/v1/campaigns/{run}": {"get": {
            "summary": "A campaign report: certificates, per-perturbation tables, parity",
            "parameters": [{"name": "run", "in": "path", "required": True, "schema": {"type": "string"},
                            "description": "run id, a unique prefix, or latest"}],
            "responses": {"200": _ok("CampaignReport", "the report"), "404": _NOT_FOUND}}},
        "/api/v1/compare": {"get": {
            "summary": "Two trajectories aligned step by step (Needleman-Wunsch on the tool path)",
            "parameters": [_param("a", _REF), _param("b", _REF)],
            "responses": {"200": _ok("Comparison", "aligned rows"), "400": _ERROR, "404": _NOT_FOUND}}},
        "/api/v1/openapi.json": {"get": {
            "summary": "This document", "responses": {"200": {"description": "OpenAPI 3.1",
                                                               "content": {"application/json": {}}}}}},
    },
    "components": {"schemas": {
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
        "TrajectorySummary": {"type": "object", "required": ["id", "trace_id", "key", "status", "decided_at"],
                              "properties": {
            "id": {"type": "integer"}, "source": {"type": "string"}, "run_id": {"type": ["string", "null"]},
            "trial_id": {"type": ["string", "null"]}, "decided_at": {"type": "number"},
            "trace_id": {"type": "string"}, "key": {"type": "string"}, "agent": {"type": ["string", "null"]},
            "service": {"type": ["string", "null"]}, "status": {"type": "string"},
            "failed": {"type": "integer"}, "worst": {"type": ["string", "null"]}}},
        "TrajectoryPage": {"type": "object", "required": ["items", "next"], "properties": {
            "items": {"type": "array", "items": {"$ref": "#/components/schemas/TrajectorySummary"}},
            "next": {"type": ["string", "null"]}}},
        "Trajectory": {"type": "object", "description": "SPEC report JSON trajectories[] record, plus id, "
                       "decided_at, source, run_id", "required": ["trace_id", "status", "steps", "verdicts"],
                       "properties": {"steps": {"type": "array", "items": {"type": "object"}},
                                      "verdicts": {"type": "array", "items": {"type": "object"}}}},
        "Rate": _RATE,
        "Conformance": {"type": "object", "required": ["buckets"], "properties": {
            "buckets": {"type": "array", "items": {"allOf": [
                {"$ref": "#/components/schemas/Rate"},
                {"type": "object", "properties": {"start": {"type": "number"}}}]}}}},
        "Overview": {"type": "object", "required": ["status", "top_violations"], "properties": {
            "status": {"type": "object", "additionalProperties": {"type": "integer"}},
            "indeterminate_share": {"type": ["number", "null"]},
            "top_violations": {"type": "array", "items": {"type": "object"}},
            "names": {"type": "object"}}},
        "CampaignRuns": {"type": "object", "required": ["runs"], "properties": {
            "runs": {"type": "array", "items": {"type": "object"}}}},
        "CampaignReport": {"type": "object", "description": "SPEC campaign report", "required": ["run_id", "arms"]},
        "Comparison": {"type": "object", "required": ["left", "right", "rows"], "properties": {
            "left": {"type": "object"}, "right": {"type": "object"},
            "rows": {"type": "array", "items": {"type": "object", "properties": {
                "mark": {"type": "string"}, "left": {"type": ["object", "null"]},
                "right": {"type": ["object", "null"]}}}}}},
    }},
}  # fmt: skip
