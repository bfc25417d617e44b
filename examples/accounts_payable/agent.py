"""An accounts-payable agent for the otel-plumb campaign example (protocol otel-plumb.agent/1).

One interpretation step asks a small LLM for the invoice id and amount in the request; every
other step is executed deterministically against a small ledger, each as an OTel GenAI
``execute_tool`` span. Two arms differ only in error handling: ``--retries 0`` treats a
failed three-way match as an exception and holds the invoice; ``--retries 3`` retries.

Run modes:
  python agent.py [--retries N]             read one request on stdin, answer on stdout
  python agent.py --http 127.0.0.1:8700     serve POST /run (a port of 0 picks a free one)
  agent:run_naive / agent:run_retry         Python callables

The LLM is any OpenAI-compatible server named by AP_LLM_URL (e.g. llama-cpp-python serving
SmolLM2-135M-Instruct); without it a deterministic regex extractor stands in, which is what
the automated tests use.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import sys
import urllib.request
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from otel_plumb.agent import Faults, InjectedFault, in_trial, setup_tracing

# The system of record: invoices, purchase orders, vendors.
INVOICES: dict[str, dict[str, Any]] = {
    "INV-7001": {"vendor": "Acme Supplies", "po": "PO-501", "total": 4500.00},
    "INV-7002": {"vendor": "Birch Logistics", "po": "PO-502", "total": 1280.50},
    "INV-7003": {"vendor": "Cobalt Tools", "po": "PO-503", "total": 960.00},
    "INV-7004": {"vendor": "Delta Foods", "po": "PO-504", "total": 15200.00},
    "INV-7005": {"vendor": "Eagle Print", "po": "PO-505", "total": 310.20},
    "INV-7006": {"vendor": "Falcon Parts", "po": "PO-506", "total": 7725.00},
    "INV-7007": {"vendor": "Granite Works", "po": "PO-507", "total": 2300.00},
    "INV-7008": {"vendor": "Harbor Freight Ltd", "po": "PO-508", "total": 640.00},
}
PURCHASE_ORDERS = {"PO-501": 4500.00, "PO-502": 1280.50, "PO-503": 960.00, "PO-504": 15200.00,
                   "PO-505": 310.20, "PO-506": 7725.00, "PO-507": 2000.00, "PO-508": 640.00}
PAID_BEFORE = {"INV-7005"}
SANCTIONED = {"Harbor Freight Ltd"}

_INVOICE_ID = re.compile(r"\bINV-\d{4}\b", re.IGNORECASE)
_AMOUNT = re.compile(r"(?:£|GBP\s*)\s?([\d,]+(?:\.\d+)?)|([\d,]+(?:\.\d+)?)\s*(?:GBP|pounds)", re.IGNORECASE)


def fake_extract(text: str) -> dict[str, Any]:
    """A deterministic stand-in for the model: the first invoice id and amount in the text."""
    inv = _INVOICE_ID.search(text)
    amount = _AMOUNT.search(text)
    value = (amount.group(1) or amount.group(2)).replace(",", "") if amount else None
    return {"invoice_id": inv.group(0).upper() if inv else None, "amount_gbp": float(value) if value else None}


def llm_extract(
    text: str, tools: list[dict[str, Any]], temperature: float | None, tracer: trace.Tracer, seed: int = 7
) -> dict[str, Any]:
    url = os.environ.get("AP_LLM_URL")
    model = os.environ.get("AP_LLM_MODEL", "SmolLM2-135M-Instruct" if url else "fake-regex-extractor")
    with tracer.start_as_current_span(f"chat {model}") as span:
        span.set_attribute("gen_ai.operation.name", "chat")
        span.set_attribute("gen_ai.request.model", model)
        if temperature is not None:
            span.set_attribute("gen_ai.request.temperature", temperature)
        if not url:
            return fake_extract(text)
        tool_note = "".join(f" A tool {t.get('name')} is available: {t.get('description', '')}." for t in tools)
        # One worked example: a 135M model copies an amount as written far more reliably than it
        # converts one to a number.
        body = {
            "model": model,
            "temperature": 0.0 if temperature is None else temperature,
            "max_tokens": 40,
            "seed": seed,
            "messages": [
                {"role": "system", "content": "Extract the invoice id and the amount from the request as JSON."
                 + tool_note},
                {"role": "user", "content": "Invoice INV-1234 from Zed Ltd for £1,250.50 needs paying."},
                {"role": "assistant", "content": '{"invoice_id": "INV-1234", "amount": "£1,250.50"}'},
                {"role": "user", "content": text},
            ],
        }
        req = urllib.request.Request(url.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            answer = json.loads(resp.read())
        content = answer["choices"][0]["message"]["content"] or ""
        usage = answer.get("usage") or {}
        span.set_attribute("gen_ai.response.model", str(answer.get("model", model)))
        span.set_attribute("gen_ai.usage.input_tokens", int(usage.get("prompt_tokens", 0)))
        span.set_attribute("gen_ai.usage.output_tokens", int(usage.get("completion_tokens", 0)))
        span.set_attribute("gen_ai.output.messages", json.dumps([{"role": "assistant", "parts": [
            {"type": "text", "content": content}]}]))
        return _parse_extraction(content, text)


def _parse_extraction(content: str, text: str) -> dict[str, Any]:
    """The model's JSON, leniently; fields it got wrong stay wrong (that is what is measured)."""
    found = re.search(r"\{.*\}", content, re.DOTALL)
    data: dict[str, Any] = {}
    if found:
        try:
            data = json.loads(found.group(0))
        except json.JSONDecodeError:
            data = {}
    inv = str(data.get("invoice_id") or "").strip().upper() or None
    raw = data.get("amount", data.get("amount_gbp"))
    try:
        amount = float(str(raw).replace(",", "").replace("£", "").replace("GBP", "").strip())
    except ValueError:
        amount = None
    return {"invoice_id": inv, "amount_gbp": amount}


class Ledger:
    """Deterministic tools; state records what the agent did."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"action": None, "paid_gbp": None, "reason_code": None}

    def fetch_invoice(self, invoice_id: str) -> dict[str, Any]:
        inv = INVOICES.get(invoice_id)
        if inv is None:
            raise LookupError(f"unknown invoice {invoice_id}")
        return {"invoice_id": invoice_id, **inv}

    def match_purchase_order(self, invoice_id: str, po: str) -> dict[str, Any]:
        ordered = PURCHASE_ORDERS.get(po)
        return {"po": po, "matched": ordered is not None and abs(ordered - INVOICES[invoice_id]["total"]) < 0.01}

    def check_duplicate(self, invoice_id: str) -> dict[str, Any]:
        return {"duplicate": invoice_id in PAID_BEFORE}

    def check_vendor_status(self, vendor: str) -> dict[str, Any]:
        return {"status": "sanctioned" if vendor in SANCTIONED else "active"}

    def schedule_payment(self, invoice_id: str, amount_gbp: float) -> dict[str, Any]:
        self.state.update(action="pay", paid_gbp=round(amount_gbp, 2))
        return {"scheduled": True}

    def flag_exception(self, invoice_id: str, reason_code: str) -> dict[str, Any]:
        self.state.update(action="hold", reason_code=reason_code)
        return {"flagged": True}

    def post_audit_log(self, invoice_id: str, action: str) -> dict[str, Any]:
        return {"logged": True}


def _tool(tracer: trace.Tracer, faults: Faults, ledger: Ledger, name: str, retries: int, **args: Any) -> Any:
    """One tool call per attempt, each its own execute_tool span; retried on an injected fault."""
    attempt = 0
    while True:
        with tracer.start_as_current_span(f"execute_tool {name}") as span:
            span.set_attribute("gen_ai.operation.name", "execute_tool")
            span.set_attribute("gen_ai.tool.name", name)
            span.set_attribute("gen_ai.tool.call.arguments", json.dumps(args))
            try:
                faults.check(name)
                result = getattr(ledger, name)(**args)
            except InjectedFault as e:
                span.set_status(Status(StatusCode.ERROR, str(e)))
                span.set_attribute("error.type", "InjectedFault")
                if attempt < retries:
                    attempt += 1
                    continue
                raise
            span.set_attribute("gen_ai.tool.call.result", json.dumps(result))
            return result


def handle(request: dict[str, Any], retries: int, carrier: dict[str, Any] | None = None) -> dict[str, Any]:
    provider = setup_tracing("ap-agent", request.get("otlp_endpoint"), protocol=request.get("otlp_protocol"))
    tracer = provider.get_tracer("ap-agent")
    faults = Faults.from_request(request)
    ledger = Ledger()
    try:
        with in_trial(carrier), tracer.start_as_current_span("invoke_agent ap-agent") as root:
            root.set_attribute("gen_ai.operation.name", "invoke_agent")
            root.set_attribute("gen_ai.agent.name", "ap-agent")
            out = _process(tracer, faults, ledger, request, retries)
        return {"output": out, "state": ledger.state}
    finally:
        provider.force_flush()
        provider.shutdown()


def _process(tracer: trace.Tracer, faults: Faults, ledger: Ledger, request: dict[str, Any], retries: int) -> str:
    # The sampling seed follows the trial: a repeated trial samples the same way (replayable),
    # different trials of a sampling variant sample differently.
    seed = int(hashlib.sha256(str(request.get("trial_id", "")).encode()).hexdigest()[:8], 16)
    got = llm_extract(request["input"], request.get("extra_tools") or [], request.get("temperature"), tracer, seed)
    invoice_id = got["invoice_id"]
    if not invoice_id:
        return "no invoice id found"

    def call(name: str, **args: Any) -> Any:
        return _tool(tracer, faults, ledger, name, retries, **args)

    def hold(reason: str) -> str:
        call("flag_exception", invoice_id=invoice_id, reason_code=reason)
        call("post_audit_log", invoice_id=invoice_id, action="hold")
        return f"held {invoice_id}: {reason}"

    try:
        invoice = call("fetch_invoice", invoice_id=invoice_id)
    except (LookupError, InjectedFault):
        return hold("INVOICE_NOT_FOUND")
    try:
        matched = call("match_purchase_order", invoice_id=invoice_id, po=invoice["po"])["matched"]
    except InjectedFault:
        matched = None  # without retries a transient error is treated as a failed match
    dup = call("check_duplicate", invoice_id=invoice_id)["duplicate"]
    vendor = call("check_vendor_status", vendor=invoice["vendor"])["status"]
    if matched is None:
        return hold("MATCH_UNAVAILABLE")
    if not matched:
        return hold("PRICE_VARIANCE")
    if dup:
        return hold("DUPLICATE")
    if vendor != "active":
        return hold("SANCTIONED_VENDOR")
    amount = got["amount_gbp"] if got["amount_gbp"] is not None else invoice["total"]
    call("schedule_payment", invoice_id=invoice_id, amount_gbp=amount)
    call("post_audit_log", invoice_id=invoice_id, action="pay")
    return f"paid {invoice_id}: £{amount:,.2f}"


def run_naive(request: dict[str, Any]) -> dict[str, Any]:
    return handle(request, retries=0, carrier=request)


def run_retry(request: dict[str, Any]) -> dict[str, Any]:
    return handle(request, retries=3, carrier=request)


async def serve(host: str, port: int, retries: int) -> None:
    from aiohttp import web

    async def run(req: web.Request) -> web.Response:
        body = await req.json()
        answer = await asyncio.to_thread(handle, body, retries, dict(req.headers))
        return web.json_response(answer)

    app = web.Application()
    app.router.add_post("/run", run)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"listening on http://{host}:{bound}/run", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--retries", type=int, default=0)
    parser.add_argument("--http", help="serve HTTP on HOST:PORT instead of reading stdin")
    args = parser.parse_args()
    if args.http:
        host, _, port = args.http.rpartition(":")
        asyncio.run(serve(host or "127.0.0.1", int(port), args.retries))
        return
    request = json.loads(sys.stdin.read())
    print(json.dumps(handle(request, args.retries)))


if __name__ == "__main__":
    main()
