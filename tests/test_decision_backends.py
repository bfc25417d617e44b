"""Backends against real local servers on 127.0.0.1: the decguard.http/0.1 protocol (labels as
shown, retries, credentials, redirects, bad answers), an OpenAI-compatible server answering with
top logprobs, the openai paraphraser, plugins through the entry-point group, and validation."""

from __future__ import annotations

import json
import math
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_plumb.decision import backends as backends_module
from otel_plumb.decision.backends import Backend, create_backend
from otel_plumb.decision.contract import BackendConfig, DecisionSpec, ParaphraseSource
from otel_plumb.decision.engine import decide_safely
from otel_plumb.decision.errors import ContractError, InvalidResponse
from otel_plumb.decision.model import CaseError, Prediction, Request, Result, validate_probabilities
from otel_plumb.decision.paraphrase import create_paraphraser

SPEC = DecisionSpec("route", "choice", ("billing", "technical", "account"))
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture()
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    servers: list[TestServer] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        return str(server.make_url("/"))

    yield start
    for server in servers:
        await server.close()


def http_backend(url: str, **settings: Any) -> Backend:
    return create_backend(BackendConfig(provider="http", url=url + "decide", **settings), decision=SPEC)


async def test_http_backend_sends_labels_as_shown_and_maps_them(serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    monkeypatch.setenv("DECIDE_TOKEN", "s3cret")

    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        body["auth"] = request.headers.get("Authorization")
        seen.append(body)
        labels = body["decision"]["labels"]
        return web.json_response(
            {
                "probabilities": {label: [0.6, 0.3, 0.1][i] for i, label in enumerate(labels)},
                "model": "m-1",
                "metadata": {"api_key": "leak", "note": "ok"},
            }
        )

    url = await serve(handler)
    backend = http_backend(url, bearer_token_env="DECIDE_TOKEN", label_map={"money": "billing"})
    shown = SPEC.shown(("account", "billing", "technical"))
    result = await backend.decide(Request("r1", shown, {"text": "hi"}))
    await backend.aclose()
    assert seen[0]["protocol"] == "decguard.http/0.1" and seen[0]["auth"] == "Bearer s3cret"
    assert seen[0]["decision"] == {"name": "route", "type": "choice", "labels": ["account", "money", "technical"]}
    assert seen[0]["input"] == {"text": "hi"} and seen[0]["case_id"] == "r1"
    assert result.probabilities == {"account": 0.6, "billing": 0.3, "technical": 0.1} and result.model == "m-1"
    assert result.metadata == {"api_key": "[REDACTED]", "note": "ok"}
    assert "s3cret" not in json.dumps(backend.info().to_json())


async def test_http_backend_retries_502_503_504_then_succeeds(serve: Any) -> None:
    attempts: list[int] = []

    async def handler(request: web.Request) -> web.Response:
        attempts.append(1)
        if len(attempts) <= 3:
            return web.Response(status=[502, 503, 504][len(attempts) - 1])
        return web.json_response({"probabilities": {"billing": 0.2, "technical": 0.3, "account": 0.5}})

    url = await serve(handler)
    backend = http_backend(url, max_retries=3, retry_backoff_s=0.0)
    result = await backend.decide(Request("r", SPEC, "x"))
    assert len(attempts) == 4 and result.selected == "account"
    attempts.clear()
    backend2 = http_backend(url, max_retries=1, retry_backoff_s=0.0)
    outcome = await decide_safely(backend2, Request("r", SPEC, "x"), 1e-3)
    assert isinstance(outcome, CaseError) and outcome.kind == "unavailable" and len(attempts) == 2
    await backend.aclose()
    await backend2.aclose()


async def test_http_backend_bad_answers_are_typed_errors(serve: Any) -> None:
    answers: list[web.Response] = []

    async def handler(request: web.Request) -> web.Response:
        return answers.pop(0)

    url = await serve(handler)
    backend = http_backend(url, timeout_s=5)
    expected = [
        (web.json_response({"probabilities": {"billing": 0.2, "technical": 0.2, "account": 0.2}}), "invalid_response"),
        (web.json_response({"probabilities": {"billing": 1.0, "technical": 0.0}}), "invalid_response"),
        (web.json_response({"answer": "billing"}), "invalid_response"),
        (web.Response(text="not json"), "invalid_response"),
        (web.json_response({"probabilities": {"billing": -0.5, "technical": 1.0, "account": 0.5}}), "invalid_response"),
        (web.Response(status=500, text="trace with secrets"), "backend_error"),
        (web.Response(status=302, headers={"Location": "http://127.0.0.1:9/elsewhere"}), "backend_error"),
    ]
    for response, kind in expected:
        answers.append(response)
        outcome = await decide_safely(backend, Request("r", SPEC, "x"), 1e-3)
        assert isinstance(outcome, CaseError) and outcome.kind == kind, outcome
        assert "secrets" not in outcome.message
    await backend.aclose()


async def test_http_backend_connection_refused_and_timeout(serve: Any) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    refused = http_backend(f"http://127.0.0.1:{port}/", max_retries=2, retry_backoff_s=0.0)
    outcome = await decide_safely(refused, Request("r", SPEC, "x"), 1e-3)
    assert isinstance(outcome, CaseError) and outcome.kind == "unavailable"
    await refused.aclose()

    async def slow(request: web.Request) -> web.Response:
        import asyncio

        await asyncio.sleep(2)
        return web.json_response({})

    url = await serve(slow)
    backend = http_backend(url, timeout_s=0.2)
    outcome = await decide_safely(backend, Request("r", SPEC, "x"), 1e-3)
    assert isinstance(outcome, CaseError) and outcome.kind == "timeout"
    await backend.aclose()


def test_http_settings_refuse_literal_credentials() -> None:
    for config in (
        {"url": "http://user:pw@127.0.0.1/x"},
        {"url": "http://127.0.0.1/x?api_key=1"},
        {"url": "http://127.0.0.1/x", "headers": {"Authorization": "Bearer x"}},
        {"url": "ftp://127.0.0.1/x"},
        {"url": "http://127.0.0.1/x", "retries": 2},
    ):
        with pytest.raises(ContractError):
            create_backend(BackendConfig(provider="http", **config), decision=SPEC)


def _logprobs_answer(tokens: dict[str, float], model: str = "tiny") -> dict[str, Any]:
    top = [{"token": token, "logprob": logprob, "bytes": None} for token, logprob in tokens.items()]
    return {
        "model": model,
        "system_fingerprint": "fp-1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": next(iter(tokens))},
                "logprobs": {"content": [{"token": next(iter(tokens)), "logprob": -0.1, "top_logprobs": top}]},
            }
        ],
    }


async def test_openai_backend_reads_option_logprobs(serve: Any) -> None:
    requests: list[dict[str, Any]] = []

    async def handler(request: web.Request) -> web.Response:
        if request.method == "GET":
            return web.json_response({"data": []})
        body = await request.json()
        requests.append(body)
        return web.json_response(_logprobs_answer({"B": -0.5, " A": -1.5, "The": -2.0, "a": -2.5, "C": -3.0}))

    url = await serve(handler)
    config = BackendConfig(provider="openai", model="tiny", url=url + "v1", api_key_env=None, seed=7)
    backend = create_backend(config, decision=SPEC)
    assert (await backend.healthcheck()).status == "ok"
    shown = SPEC.shown(("technical", "account", "billing"))
    result = await backend.decide(Request("r", shown, "The app crashes"))
    await backend.aclose()
    body = requests[0]
    assert body["logprobs"] is True and body["top_logprobs"] == 20 and body["max_tokens"] == 1 and body["seed"] == 7
    assert "A) technical\nB) account\nC) billing" in body["messages"][1]["content"]
    mass = {"technical": math.exp(-1.5) + math.exp(-2.5), "account": math.exp(-0.5), "billing": math.exp(-3.0)}
    total = sum(mass.values())
    assert result.probabilities == pytest.approx({k: v / total for k, v in mass.items()})
    assert result.selected == "account" and result.model == "tiny"
    assert result.metadata["seed"] == 7 and result.metadata["system_fingerprint"] == "fp-1"
    assert result.metadata["option_mass"] == pytest.approx(total)


async def test_openai_backend_invalid_answers(serve: Any) -> None:
    answers = [
        _logprobs_answer({"The": -0.1, "Hello": -1.0}),
        {"choices": [{"message": {"content": "A"}}]},
        _logprobs_answer({"A": 0.5}),
    ]

    async def handler(request: web.Request) -> web.Response:
        return web.json_response(answers.pop(0))

    url = await serve(handler)
    backend = create_backend(BackendConfig(provider="openai", url=url, api_key_env=None), decision=SPEC)
    for _ in range(3):
        outcome = await decide_safely(backend, Request("r", SPEC, "x"), 1e-3)
        assert isinstance(outcome, CaseError) and outcome.kind == "invalid_response"
    await backend.aclose()


async def test_openai_backend_needs_its_key_from_the_environment(serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    backend = create_backend(BackendConfig(provider="openai", url="http://127.0.0.1:9/v1"), decision=SPEC)
    with pytest.raises(ContractError, match="OPENAI_API_KEY"):
        await backend.decide(Request("r", SPEC, "x"))


async def test_openai_paraphraser(serve: Any) -> None:
    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        assert body["seed"] == 5 and "2 times" in body["messages"][0]["content"]
        return web.json_response(
            {
                "model": "para-1",
                "system_fingerprint": "fp-9",
                "choices": [{"message": {"content": '```json\n["One.", "Two."]\n```'}}],
            }
        )

    url = await serve(handler)
    source = ParaphraseSource(provider="openai", model="para", url=url + "v1", api_key_env=None)
    paraphraser = create_paraphraser(source, base_dir=Path("."))
    assert await paraphraser.paraphrase("Text.", case_id="c", n=2, seed=5) == ["One.", "Two."]
    assert paraphraser.provenance()["response_model"] == "para-1"
    assert paraphraser.provenance()["response_system_fingerprint"] == "fp-9"
    await paraphraser.aclose()


class _Constant(Backend):
    provider = "constant"

    @classmethod
    def from_config(cls, config: BackendConfig, *, name: str, decision: DecisionSpec) -> Backend:
        return cls(name=name, model=config.model)

    async def predict(self, request: Request) -> Prediction:
        return Prediction({label: 1.0 if i == 0 else 0.0 for i, label in enumerate(request.decision.labels)})


def test_plugins_come_from_the_entry_point_group(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    entry = EntryPoint(name="constant", value=f"{__name__}:_Constant", group=backends_module.ENTRY_POINT_GROUP)

    def entry_points(*, group: str, name: str | None = None) -> list[EntryPoint]:
        return [entry] if group == backends_module.ENTRY_POINT_GROUP and name in (None, "constant") else []

    monkeypatch.setattr(backends_module, "entry_points", entry_points)
    backend = create_backend(BackendConfig(provider="constant"), decision=SPEC)
    assert isinstance(backend, _Constant) and "constant" in backends_module.available()
    with pytest.raises(ContractError, match="unknown backend provider 'nope'"):
        create_backend(BackendConfig(provider="nope"), decision=SPEC)


@settings(deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["billing", "technical", "account", "other"]),
        st.one_of(st.floats(allow_nan=True), st.integers(-2, 2), st.booleans(), st.text(max_size=2)),
    )
)
def test_probabilities_are_validated_never_repaired(raw: dict[str, Any]) -> None:
    try:
        ordered = validate_probabilities(SPEC.labels, raw)
    except InvalidResponse:
        return
    assert list(ordered) == list(SPEC.labels) and all(ordered[k] == raw[k] for k in ordered)
    assert abs(sum(ordered.values()) - 1.0) <= 1e-3 and all(v >= 0 for v in ordered.values())


def test_result_json_has_decguard_fields() -> None:
    result = Result(
        "c",
        "route",
        "choice",
        SPEC.labels,
        {"billing": 1.0, "technical": 0.0, "account": 0.0},
        "billing",
        1.0,
        "default",
        "mock",
        "mock",
        None,
        0.1,
        {},
    )
    from decguard.decisions import DecisionResult

    assert DecisionResult.model_validate(result.to_json()).selected == "billing"


async def test_openai_backend_with_label_tokens(serve: Any) -> None:
    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        assert "- billing\n- technical\n- account" in body["messages"][1]["content"]
        return web.json_response(_logprobs_answer({" Technical": -0.2, "bill": -2.0, "acc": -3.0, "x": -0.5}))

    url = await serve(handler)
    config = BackendConfig(provider="openai", url=url, api_key_env=None, options="labels")
    backend = create_backend(config, decision=SPEC)
    result = await backend.decide(Request("r", SPEC, "x"))
    await backend.aclose()
    assert result.selected == "technical" and result.metadata["options_missing"] == []
    assert result.probabilities["billing"] == pytest.approx(math.exp(-2.0) / sum(math.exp(v) for v in (-0.2, -2, -3)))


async def test_http_backend_overlaps_requests_and_checks_health(serve: Any) -> None:
    import asyncio

    active = {"now": 0, "peak": 0}

    async def handler(request: web.Request) -> web.Response:
        if request.method == "GET":
            return web.Response(status=503)
        active["now"] += 1
        active["peak"] = max(active["peak"], active["now"])
        await asyncio.sleep(0.05)
        active["now"] -= 1
        return web.json_response({"probabilities": {"billing": 1.0, "technical": 0.0, "account": 0.0}})

    from otel_plumb.decision.engine import decide_cases
    from otel_plumb.decision.model import Case

    url = await serve(handler)
    backend = http_backend(url, health_url=url + "health")
    assert (await backend.healthcheck()).status == "unhealthy"
    records = await decide_cases(backend, SPEC, [Case(f"c{i}", "x") for i in range(8)], concurrency=4, tolerance=1e-3)
    await backend.aclose()
    assert [r.case.id for r in records] == [f"c{i}" for i in range(8)] and all(r.result for r in records)
    assert active["peak"] == 4


def test_probabilities_too_large_to_sum_are_refused_not_a_crash() -> None:
    huge = {"billing": 0.0, "technical": 8.988465674311579e307, "account": 8.98846567431158e307}
    with pytest.raises(InvalidResponse, match="over 1"):
        validate_probabilities(SPEC.labels, huge)
