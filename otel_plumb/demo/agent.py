"""A small instrumented accounts-payable agent, for the demo.

It plays a scripted model (no network, deterministic) and calls the AP tools, emitting OTel
GenAI spans through the OpenTelemetry SDK: ``invoke_agent`` at the root, ``chat`` spans for
the model turns (with the tool calls the model asked for in ``gen_ai.output.messages``), and
``execute_tool`` spans with ``gen_ai.tool.call.arguments`` and ``gen_ai.tool.call.result``.
Some invoices trigger deliberate faults: skipping the duplicate check, paying twice, paying
the wrong amount.

Under a campaign (protocol ``otel-plumb.agent/1``) two builds of it are arms: :func:`faulty_build`,
the agent as above, which carries on past a failed tool call, and :func:`fixed_build`, with the
faults fixed and a failed tool call retried.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode

from otel_plumb.agent import Faults, InjectedFault, in_trial

AGENT = "ap-agent"
SERVICE = "ap-service"
MODEL = "scripted-ap-model"
# After paying twice the agent keeps working for a while (as a real run would, between model
# calls): the early verdict arrives while the run is still going, before its root span ends
# (once it has held for the demo processor's confirm_wait).
PAUSE_AFTER_DOUBLE_PAYMENT_S = 1.0


@dataclass(frozen=True, slots=True)
class Invoice:
    invoice_id: str
    vendor: str
    total: float
    purchase_order: str
    vendor_status: str = "active"
    # None: behaves; otherwise one of "skip_duplicate_check", "pay_twice", "wrong_amount".
    fault: str | None = None


INVOICES = (
    Invoice("INV-1001", "Acme Supplies", 1250.00, "PO-77"),
    Invoice("INV-1002", "Globex", 980.50, "PO-78", fault="skip_duplicate_check"),
    Invoice("INV-1003", "Initech", 4310.00, "PO-79", fault="pay_twice"),
    Invoice("INV-1004", "Umbrella Ltd", 615.20, "PO-80", fault="wrong_amount"),
    Invoice("INV-1005", "Hooli", 2200.00, "PO-81", vendor_status="sanctioned"),
    Invoice("INV-1006", "Stark Industries", 75.99, "PO-82"),
)


def _tools(invoice: Invoice) -> dict[str, Any]:
    """The tools' answers for one invoice (a stand-in for the ERP)."""
    return {
        "fetch_invoice": {"invoice_id": invoice.invoice_id, "vendor": invoice.vendor, "total": invoice.total},
        "match_purchase_order": {"purchase_order": invoice.purchase_order, "matched": True},
        "check_duplicate": {"duplicate": False},
        "check_vendor_status": {"vendor": invoice.vendor, "status": invoice.vendor_status},
        "schedule_payment": {"payment_id": f"PAY-{invoice.invoice_id[4:]}", "status": "scheduled"},
        "flag_exception": {"exception_id": f"EXC-{invoice.invoice_id[4:]}"},
        "post_audit_log": {"logged": True},
    }


def plan(invoice: Invoice) -> list[tuple[str, dict[str, Any]]]:
    """The tool calls the scripted model makes for an invoice, faults included."""
    inv = {"invoice_id": invoice.invoice_id}
    steps: list[tuple[str, dict[str, Any]]] = [
        ("fetch_invoice", inv),
        ("match_purchase_order", {**inv, "purchase_order": invoice.purchase_order}),
    ]
    if invoice.fault != "skip_duplicate_check":
        steps.append(("check_duplicate", {**inv, "vendor": invoice.vendor, "amount_gbp": invoice.total}))
    steps.append(("check_vendor_status", {"vendor": invoice.vendor}))
    if invoice.vendor_status != "active":
        steps.append(("flag_exception", {**inv, "reason": f"vendor {invoice.vendor_status}"}))
        steps.append(("post_audit_log", {**inv, "event": "payment blocked"}))
        return steps
    amount = round(invoice.total * 10, 2) if invoice.fault == "wrong_amount" else invoice.total
    payment = {**inv, "vendor": invoice.vendor, "amount_gbp": amount}
    steps.append(("schedule_payment", payment))
    if invoice.fault == "pay_twice":
        steps.append(("schedule_payment", payment))
    steps.append(("post_audit_log", {**inv, "event": "payment scheduled"}))
    return steps


def run_invoice(tracer: trace.Tracer, invoice: Invoice, run_id: str = "", faults: Faults | None = None,
                retries: int = 0) -> str:
    """Process one invoice; returns the trace id (hex). ``faults``: tool calls that fail as a
    campaign injects them; each failed call is retried up to ``retries`` times, then skipped."""
    answers = _tools(invoice)
    with tracer.start_as_current_span(
        f"invoke_agent {AGENT}",
        kind=trace.SpanKind.INTERNAL,
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": AGENT,
            "gen_ai.provider.name": "demo",
            "invoice.id": invoice.invoice_id,
            "plumb.case.id": invoice.invoice_id,
            "plumb.trial.id": run_id or invoice.invoice_id,
        },
    ) as root:
        calls = plan(invoice)
        n = 0  # model turns so far: each asks for one tool call
        for planned, (tool, args) in enumerate(calls):
            for _attempt in range(retries + 1):
                n += 1
                if _call_tool(tracer, invoice, n - 1, tool, args, answers, faults):
                    break
            if invoice.fault == "pay_twice" and tool == "schedule_payment" and planned == len(calls) - 2:
                time.sleep(PAUSE_AFTER_DOUBLE_PAYMENT_S)
        model_call(tracer, 400, 30)
        return format(root.get_span_context().trace_id, "032x")


def _call_tool(tracer: trace.Tracer, invoice: Invoice, n: int, tool: str, args: dict[str, Any],
               answers: dict[str, Any], faults: Faults | None) -> bool:
    """The model's turn ``n`` asking for the call, then the call; False when the tool failed."""
    call_id = f"call_{invoice.invoice_id}_{n}"
    tool_call = {"type": "tool_call", "id": call_id, "name": tool, "arguments": args}
    request = {"role": "assistant", "parts": [tool_call], "finish_reason": "tool_call"}
    model_call(tracer, 120 + 40 * n, 24, [request])
    with tracer.start_as_current_span(
        f"execute_tool {tool}",
        kind=trace.SpanKind.INTERNAL,
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.agent.name": AGENT,
            "gen_ai.tool.name": tool,
            "gen_ai.tool.type": "function",
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.call.arguments": json.dumps(args),
            # As a baggage span processor would copy them: the case and the business key
            # are known on every span, so early verdicts name the invoice too.
            "invoice.id": invoice.invoice_id,
            "plumb.case.id": invoice.invoice_id,
        },
    ) as span:
        try:
            if faults is not None:
                faults.check(tool)
        except InjectedFault as e:
            span.set_status(Status(StatusCode.ERROR, str(e)))
            return False
        span.set_attribute("gen_ai.tool.call.result", json.dumps(answers[tool]))
        span.set_status(Status(StatusCode.OK))
    return True


def model_call(
    tracer: trace.Tracer, input_tokens: int, output_tokens: int, output_messages: list[dict[str, Any]] | None = None
) -> None:
    """One chat span; the scripted model answers at once, so the span has no duration to speak of."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "demo",
        "gen_ai.request.model": MODEL,
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
    }
    if output_messages is not None:
        attributes["gen_ai.output.messages"] = json.dumps(output_messages)
    with tracer.start_as_current_span(f"chat {MODEL}", kind=trace.SpanKind.CLIENT, attributes=attributes):
        pass


def run_all(provider: TracerProvider, invoices: tuple[Invoice, ...] = INVOICES) -> list[str]:
    tracer = provider.get_tracer("otel_plumb.demo.agent")
    return [run_invoice(tracer, invoice) for invoice in invoices]


def _campaign_trial(request: dict[str, Any], invoice: Invoice, retries: int) -> dict[str, Any]:
    """One campaign trial: the invoice of the request's case, in the trial's trace, exported to
    the campaign's receiver before answering."""
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=request["otlp_endpoint"], insecure=True)))
    try:
        with in_trial(request):
            run_invoice(provider.get_tracer("otel_plumb.demo.agent"), invoice, request["trial_id"],
                        Faults.from_request(request), retries)
        provider.force_flush()
    finally:
        provider.shutdown()
    return {"output": f"processed {invoice.invoice_id}", "state": None}


def _invoice(request: dict[str, Any]) -> Invoice:
    return next(i for i in INVOICES if i.invoice_id == request["case_id"])


def faulty_build(request: dict[str, Any]) -> dict[str, Any]:
    """The demo agent as it is: its faults, and no retry of a failed tool call."""
    return _campaign_trial(request, _invoice(request), retries=0)


def fixed_build(request: dict[str, Any]) -> dict[str, Any]:
    """The demo agent fixed: no deliberate faults, and a failed tool call retried once."""
    return _campaign_trial(request, replace(_invoice(request), fault=None), retries=1)
