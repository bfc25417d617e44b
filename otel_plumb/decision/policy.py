"""One decision with the contract's first-match runtime policy (DecGuard's ``run``). A
``fallback`` result names the fallback backend; it is not invoked, so the caller keeps control
of side effects and cascades."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from otel_plumb.decision.backends import create_backend
from otel_plumb.decision.contract import DEFAULT_BACKEND, Policy, load_contract
from otel_plumb.decision.errors import ContractError, DecisionError
from otel_plumb.decision.model import DecisionInput, Request, Result


def apply_policy(policy: Policy, result: Result) -> dict[str, Any]:
    for index, route in enumerate(policy.routes):
        if route.when is None or result.confidence >= route.when.confidence_gte:
            return {
                "result": result.to_json(),
                "action": route.action,
                "fallback_backend": route.backend,
                "route_index": index,
            }
    raise AssertionError("a validated policy ends with an unconditional route")


async def decide_with_policy(
    contract: str | Path,
    value: DecisionInput,
    *,
    backend: str | None = None,
    case_id: str = "runtime",
    check_health: bool = True,
) -> dict[str, Any]:
    loaded = load_contract(contract)
    c = loaded.contract
    if c.policy is None:
        raise ContractError("the contract has no 'policy' section")
    instance = create_backend(c.backend_config(backend), decision=c.spec(), name=backend or DEFAULT_BACKEND)
    try:
        if check_health:
            health = await instance.healthcheck()
            if health.status == "unhealthy":
                raise DecisionError(f"backend {instance.name!r} is unhealthy: {health.detail}")
        result = await instance.decide(Request(case_id, c.spec(), value), tolerance=c.evaluation.probability_tolerance)
    finally:
        await instance.aclose()
    return apply_policy(c.policy, result)
