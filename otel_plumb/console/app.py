"""The console: a read-only JSON API (``/api/v1/...``, described at ``/api/v1/openapi.json``)
and server-rendered pages over a trajectory store, which may also hold a campaign store's runs.

Every page is a plain URL with its filters in the query string, so an alert, a dashboard link or
an exemplar's trace id links straight to it (``/trajectories/<trace id>``). Values from traces
are escaped by Jinja2's autoescape; no page runs a script that came from a trace.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from otel_plumb.console import queries
from otel_plumb.console.charts import bounds_chart, conformance_chart
from otel_plumb.console.openapi import OPENAPI
from otel_plumb.model import SEVERITIES
from otel_plumb.report.html import template_env
from otel_plumb.store import QueryError, TrajectoryStore

_ENV = template_env(os.path.dirname(os.path.abspath(__file__)))
# Values as JSON text (then escaped like any text): "<script>" shows as typed.
_ENV.filters["pretty"] = lambda v: json.dumps(v, indent=1, ensure_ascii=False, default=str)
_ENV.filters["isotime"] = lambda t: "" if t is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(t)))


class ConsoleSettings:
    """``trace_url``: a template for the tracing backend's page of a trace, with ``{trace_id}``
    (Jaeger ``http://jaeger:16686/trace/{trace_id}``, Grafana/Tempo ``.../explore?...{trace_id}``,
    Phoenix, Langfuse); empty: no link."""

    __slots__ = ("path", "root", "trace_url")

    def __init__(self, path: Path, trace_url: str = "", root: str = "") -> None:
        self.path = path
        self.trace_url = trace_url
        # The prefix the console is mounted under ("" on its own listener), for its links.
        self.root = root


STORE_KEY = web.AppKey("store", TrajectoryStore)
SETTINGS_KEY = web.AppKey("settings", ConsoleSettings)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(data, default=str), status=status, content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )  # fmt: skip


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bad parameters are a 400 naming the parameter; the API answers in JSON, pages in HTML."""
    try:
        return await handler(request)
    except QueryError as exc:
        if request.path.startswith("/api/"):
            return _json({"error": str(exc)}, 400)
        return _page("error.html", request, status=400, title="Bad request", message=str(exc))


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    # Pages run only the console's own inline script; nothing is framed or sniffed.
    response.headers.setdefault("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; "
                                "script-src 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'")  # fmt: skip
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    return response


def _store(request: web.Request) -> TrajectoryStore:
    return request.app[STORE_KEY]


def _settings(request: web.Request) -> ConsoleSettings:
    return request.app[SETTINGS_KEY]


async def _run(fn: Callable[..., Any], *args: Any) -> Any:
    """Queries run on a thread: a slow one never stalls the event loop (nor, when mounted in
    ``otel-plumb run``, the processor)."""
    return await asyncio.to_thread(fn, *args)


def _params(request: web.Request) -> dict[str, str]:
    return dict(request.query)


def _page(template: str, request: web.Request, status: int = 200, **context: Any) -> web.Response:
    body = _ENV.get_template(template).render(root=_settings(request).root, request=request, **context)
    return web.Response(text=body, status=status, content_type="text/html", headers={"Cache-Control": "no-store"})


# ---- API -----------------------------------------------------------------------------------------


async def api_trajectories(request: web.Request) -> web.Response:
    return _json(await _run(queries.trajectories, _store(request), _params(request)))


async def api_trajectory(request: web.Request) -> web.Response:
    record = await _run(_store(request).get, request.match_info["ref"])
    if record is None:
        return _json({"error": f"no trajectory {request.match_info['ref']!r} in this store"}, 404)
    return _json(record)


async def api_conformance(request: web.Request) -> web.Response:
    return _json(await _run(queries.conformance, _store(request), _params(request)))


async def api_overview(request: web.Request) -> web.Response:
    since = queries.when(request.query.get("since"), "since") or time.time() - queries.DAY
    return _json(await _run(queries.overview, _store(request), since))


async def api_campaigns(request: web.Request) -> web.Response:
    return _json({"runs": await _run(queries.campaign_runs, _settings(request).path)})


async def api_campaign(request: web.Request) -> web.Response:
    report = await _campaign(request)
    if report is None:
        return _json({"error": f"no campaign run {request.match_info['run']!r} in this store"}, 404)
    return _json(report)


async def api_compare(request: web.Request) -> web.Response:
    found = await _run(queries.compare, _store(request), request.query.get("a"), request.query.get("b"))
    if found is None:
        return _json({"error": "a or b is not a trajectory in this store"}, 404)
    return _json(found)


async def api_openapi(_request: web.Request) -> web.Response:
    return _json(OPENAPI)


async def _campaign(request: web.Request) -> dict[str, Any] | None:
    path = _settings(request).path
    report: dict[str, Any] | None = await _run(queries.campaign_report, path, request.match_info["run"])
    return report


# ---- pages ---------------------------------------------------------------------------------------


async def page_overview(request: web.Request) -> web.Response:
    store = _store(request)
    since = queries.when(request.query.get("since"), "since") or time.time() - queries.DAY
    data = await _run(queries.overview, store, since)
    charts = []
    for policy in data["names"]["policies"][:12]:
        series = await _run(queries.conformance, store, {"policy": policy, "since": str(since), "bucket": "3600"})
        charts.append({"policy": policy, "svg": conformance_chart(series["buckets"]), "buckets": series["buckets"]})
    runs = await _run(queries.campaign_runs, _settings(request).path)
    return _page("overview.html", request, title="Overview", data=data, charts=charts, runs=runs[:5])


async def page_violations(request: web.Request) -> web.Response:
    params = _params(request)
    params.setdefault("status", "violating")
    store = _store(request)
    result = await _run(queries.trajectories, store, params)
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    names = await _run(store.names)
    # The page's records in one trip to the query thread, not one per row.
    records = await _run(lambda: [store.get(str(item["id"])) for item in result["items"]])
    for item, record in zip(result["items"], records, strict=True):
        for v in (record or {}).get("verdicts", []):
            if v.get("verdict") != "fail":
                continue
            if params.get("invariant") and v.get("invariant") != params["invariant"]:
                continue
            key = (v.get("severity") or "", v.get("policy") or "", v.get("invariant") or "")
            groups.setdefault(key, []).append({"item": item, "verdict": v})
    grouped = sorted(groups.items(), key=lambda kv: (
        SEVERITIES.index(kv[0][0]) if kv[0][0] in SEVERITIES else 9, kv[0]))  # fmt: skip
    return _page("violations.html", request, title="Violations", groups=grouped, result=result, params=params,
                 names=names)  # fmt: skip


async def page_trajectories(request: web.Request) -> web.Response:
    params = _params(request)
    result = await _run(queries.trajectories, _store(request), params)
    names = await _run(_store(request).names)
    return _page("trajectories.html", request, title="Trajectories", result=result, params=params, names=names)


async def page_trajectory(request: web.Request) -> web.Response:
    ref = request.match_info["ref"]
    record = await _run(_store(request).get, ref)
    if record is None:
        return _page("error.html", request, status=404, title="Not found",
                     message=f"No trajectory {ref!r} in this store.")  # fmt: skip
    offending: dict[int, list[dict[str, Any]]] = {}
    on_trajectory = []
    for v in record.get("verdicts", []):
        if v.get("verdict") != "fail":
            continue
        if v.get("step_index") is None:
            on_trajectory.append(v)
        else:
            offending.setdefault(int(v["step_index"]), []).append(v)
    trace_url = _settings(request).trace_url
    link = trace_url.replace("{trace_id}", html.escape(record.get("trace_id") or "", quote=True)) if trace_url else ""
    return _page("trajectory.html", request, title=f"Trajectory {record.get('key')}", record=record,
                 offending=offending, on_trajectory=on_trajectory, trace_link=link)  # fmt: skip


async def page_campaigns(request: web.Request) -> web.Response:
    runs = await _run(queries.campaign_runs, _settings(request).path)
    return _page("campaigns.html", request, title="Campaigns", runs=runs)


async def page_campaign(request: web.Request) -> web.Response:
    report = await _campaign(request)
    if report is None:
        return _page("error.html", request, status=404, title="Not found",
                     message=f"No campaign run {request.match_info['run']!r} in this store.")  # fmt: skip
    charts = {arm: bounds_chart(data["perturbations"]) for arm, data in report["arms"].items()}
    return _page("campaign.html", request, title=f"Campaign {report['campaign']}", report=report, charts=charts,
                 diffs=_baseline_pairs(report))  # fmt: skip


def _baseline_pairs(report: dict[str, Any]) -> dict[tuple[str, str], tuple[str, str]]:
    """For each (arm, trial) a divergence names: the trace of a baseline trial of the same case
    and arm, and its own, to show side by side."""
    trials = {t["trial_id"]: t for t in report["trials"]}
    baseline = {(t["arm"], t["case_id"]): t["trace_id"] for t in report["trials"]
                if t["perturbation"] == "baseline" and t["trace_id"]}  # fmt: skip
    pairs = {}
    for arm, data in report["arms"].items():
        for p in data["perturbations"].values():
            for d in p.get("divergences", []):
                trial = trials.get(d.get("example_trial"))
                if trial is None or not trial["trace_id"]:
                    continue
                base = baseline.get((arm, trial["case_id"]))
                if base is not None and base != trial["trace_id"]:
                    pairs[(arm, trial["trial_id"])] = (base, trial["trace_id"])
    return pairs


async def page_compare(request: web.Request) -> web.Response:
    found = await _run(queries.compare, _store(request), request.query.get("a"), request.query.get("b"))
    if found is None:
        return _page("error.html", request, status=404, title="Not found",
                     message="a or b is not a trajectory in this store.")  # fmt: skip
    return _page("compare.html", request, title="Compare", found=found)


def console_app(path: str | Path, trace_url: str = "", root: str = "") -> web.Application:
    """The console over the store at ``path``, opened read-only; ``root``: the prefix it is
    mounted under as a sub-application."""
    store = TrajectoryStore(path, readonly=True)
    app = web.Application(middlewares=[_headers, _errors])
    app[STORE_KEY] = store
    app[SETTINGS_KEY] = ConsoleSettings(Path(path), trace_url, root.rstrip("/"))
    app.router.add_get("/api/v1/openapi.json", api_openapi)
    app.router.add_get("/api/v1/overview", api_overview)
    app.router.add_get("/api/v1/trajectories", api_trajectories)
    app.router.add_get("/api/v1/trajectories/{ref}", api_trajectory)
    app.router.add_get("/api/v1/conformance", api_conformance)
    app.router.add_get("/api/v1/campaigns", api_campaigns)
    app.router.add_get("/api/v1/campaigns/{run}", api_campaign)
    app.router.add_get("/api/v1/compare", api_compare)
    app.router.add_get("/", page_overview)
    app.router.add_get("/violations", page_violations)
    app.router.add_get("/trajectories", page_trajectories)
    app.router.add_get("/trajectories/{ref}", page_trajectory)
    app.router.add_get("/campaigns", page_campaigns)
    app.router.add_get("/campaigns/{run}", page_campaign)
    app.router.add_get("/compare", page_compare)

    async def close(_app: web.Application) -> None:
        store.close()

    app.on_cleanup.append(close)
    return app
