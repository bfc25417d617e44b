"""The Helm chart, rendered and linted by the real Helm CLI in both modes, its manifests checked
against the Kubernetes schemas (kubernetes-validate, offline), its values against
values.schema.json (check-jsonschema), and what it generates loaded by the processor itself."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import grpc
import kubernetes_validate
import pytest
import yaml

from otel_plumb.check import load_policies
from otel_plumb.processor.config import exposure_errors, load_config

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "otel-plumb"
EXAMPLES = ROOT / "helm" / "examples"
POLICY_ARGS = [
    "--set-file", f"policies.ap-controls={ROOT / 'configs' / 'policies' / 'ap.yaml'}",
    "--set-file", f"policyData.ap-truth={ROOT / 'configs' / 'policies' / 'ap-truth.yaml'}",
]  # fmt: skip
K8S_VERSION = "1.33.0"
# Custom resources of the Prometheus Operator: no schema ships with kubernetes-validate; their
# content is checked separately (the rules with promtool).
CUSTOM_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def _helm() -> str:
    helm = shutil.which("helm") or "/usr/local/bin/helm"
    if not os.access(helm, os.X_OK):
        pytest.fail("helm not found: run .ci/install.d/30-helm.sh")
    return helm


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_helm(), *args], capture_output=True, text=True, timeout=60, check=False)


def render(values: Path, *extra: str) -> list[dict[str, Any]]:
    result = helm("template", "plumb", str(CHART), "--namespace", "agents", "-f", str(values), *POLICY_ARGS, *extra)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        kinds.setdefault(doc["kind"], []).append(doc)
    return kinds


def validate(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        if doc["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def check_generated_files(kinds: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    """The processor loads the generated config and policies as they would be mounted."""
    configs = {cm["metadata"]["name"]: cm["data"] for cm in kinds["ConfigMap"]}
    policy_dir = tmp_path / "policies"
    policy_dir.mkdir()
    for name, content in configs["plumb-otel-plumb-policies"].items():
        (policy_dir / name).write_text(content)
    config_file = tmp_path / "config.yaml"
    text = configs["plumb-otel-plumb-config"]["config.yaml"].replace("/etc/otel-plumb/policies", str(policy_dir))
    config_file.write_text(text)
    with pytest.MonkeyPatch.context() as env:
        # The header value comes from the Secret through this variable.
        env.setenv("OTEL_PLUMB_HEADER_AUTHORIZATION", "Bearer test")
        config = load_config(str(config_file), {})
    assert config.policies == [str(policy_dir / "ap-controls.yaml")]
    # The processor would start: nothing beyond loopback is left without TLS or auth.
    assert exposure_errors(config) == []
    assert [p.name for p in load_policies(config.policies)] == ["ap-controls"]


@pytest.mark.parametrize("source", ["prometheus/rules.yaml", "grafana/otel-plumb-dashboard.json"])
def test_chart_copies_are_the_configs(source: str) -> None:
    original = ROOT / "configs" / source
    copy = CHART / "files" / original.name
    assert copy.read_text() == original.read_text(), f"{copy} differs: cp {original} {copy}"


@pytest.mark.parametrize("values", ["gateway-values.yaml", "sidecar-values.yaml"])
def test_lint_strict(values: str) -> None:
    result = helm("lint", "--strict", str(CHART), "-f", str(EXAMPLES / values), *POLICY_ARGS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_lint_refuses_values_outside_the_schema() -> None:
    result = helm("lint", str(CHART), "--set", "mode=daemonset")
    assert result.returncode != 0
    assert "mode" in result.stdout + result.stderr


def test_gateway(tmp_path: Path) -> None:
    docs = render(EXAMPLES / "gateway-values.yaml", "--set", "export.headers.authorization=Bearer x")
    validate(docs)
    kinds = by_kind(docs)
    # Persistent export queue: one volume per replica.
    (workload,) = kinds["StatefulSet"]
    assert "Deployment" not in kinds
    claims = workload["spec"]["volumeClaimTemplates"]
    assert claims[0]["metadata"]["name"] == "otel-plumb-state"
    pod = workload["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # TLS by default: kubelet probes speak HTTPS (and do not verify the certificate).
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics", "scheme": "HTTPS"}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/lib/otel-plumb", "/tmp", "/etc/otel-plumb/policies"} <= mounts
    header_env = container["env"][0]
    assert header_env["valueFrom"]["secretKeyRef"] == {"name": "plumb-otel-plumb-export", "key": "authorization"}
    secrets = {s["metadata"]["name"]: s for s in kinds["Secret"]}
    assert secrets["plumb-otel-plumb-export"]["stringData"] == {"authorization": "Bearer x"}

    (service,) = kinds["Service"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == workload["spec"]["selector"]["matchLabels"]
    assert workload["spec"]["serviceName"] == service["metadata"]["name"]
    (hpa,) = kinds["HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "plumb-otel-plumb"}
    assert "replicas" not in workload["spec"]  # the HPA owns it
    (pdb,) = kinds["PodDisruptionBudget"]
    assert pdb["spec"]["selector"] == workload["spec"]["selector"]
    (dashboard,) = [cm for cm in kinds["ConfigMap"] if cm["metadata"]["name"].endswith("-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(dashboard["data"]["otel-plumb-dashboard.json"])
    assert board == json.loads((ROOT / "configs" / "grafana" / "otel-plumb-dashboard.json").read_text())
    (monitor,) = kinds["ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    check_generated_files(kinds, tmp_path)


def test_gateway_without_persistence_is_a_deployment() -> None:
    docs = render(EXAMPLES / "gateway-values.yaml", "--set", "persistence.enabled=false")
    validate(docs)
    kinds = by_kind(docs)
    (workload,) = kinds["Deployment"]
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    assert volumes["otel-plumb-state"] == {"name": "otel-plumb-state", "emptyDir": {}}
    assert kinds["HorizontalPodAutoscaler"][0]["spec"]["scaleTargetRef"]["kind"] == "Deployment"


def test_prometheus_rule_is_the_rules_file(tmp_path: Path) -> None:
    (rule,) = by_kind(render(EXAMPLES / "gateway-values.yaml"))["PrometheusRule"]
    rules = yaml.safe_load((ROOT / "configs" / "prometheus" / "rules.yaml").read_text())
    assert rule["spec"] == rules
    rendered = tmp_path / "rendered-rules.yaml"
    rendered.write_text(yaml.safe_dump(rule["spec"]))
    promtool = shutil.which("promtool") or "promtool"
    result = subprocess.run([promtool, "check", "rules", str(rendered)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_sidecar(tmp_path: Path) -> None:
    docs = render(EXAMPLES / "sidecar-values.yaml")
    validate(docs)
    kinds = by_kind(docs)
    assert not {"Deployment", "StatefulSet", "Service", "HorizontalPodAutoscaler"} & kinds.keys()
    patch_map = next(cm for cm in kinds["ConfigMap"] if cm["metadata"]["name"].endswith("-sidecar-patch"))
    patch = yaml.safe_load(patch_map["data"]["patch.yaml"])["spec"]["template"]
    (sidecar,) = patch["spec"]["initContainers"]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: stops after the agent
    (pod_monitor,) = kinds["PodMonitor"]
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= patch["metadata"]["labels"].items()
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == sidecar["ports"][0]["name"]
    # The agent's Deployment with the patch applied is a valid Deployment.
    agent = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "agent", "namespace": "agents"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent", **patch["metadata"]["labels"]}},
                "spec": {
                    "containers": [{"name": "agent", "image": "agent:1"}],
                    "initContainers": patch["spec"]["initContainers"],
                    "volumes": patch["spec"]["volumes"],
                },
            },
        },
    }
    kubernetes_validate.validate(agent, K8S_VERSION, strict=True)
    config = yaml.safe_load(
        next(cm for cm in kinds["ConfigMap"] if cm["metadata"]["name"].endswith("-config"))["data"]["config.yaml"]
    )
    # Only the agent in the same pod sends to the sidecar.
    assert config["receivers"]["grpc"]["endpoint"] == "127.0.0.1:4317"
    check_generated_files(kinds, tmp_path)


def check_jsonschema(*instances: Path) -> subprocess.CompletedProcess[str]:
    schema = CHART / "values.schema.json"
    args = [sys.executable, "-m", "check_jsonschema", "--schemafile", str(schema), *map(str, instances)]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def test_values_files_match_the_schema(tmp_path: Path) -> None:
    result = check_jsonschema(CHART / "values.yaml", *sorted(EXAMPLES.glob("*.yaml")))
    assert result.returncode == 0, result.stdout + result.stderr
    bad = tmp_path / "bad-values.yaml"
    bad.write_text("mode: gateway\nexport: {endpoint: tempo:4317}\ngateway: {replicas: 0}\n")
    result = check_jsonschema(bad)
    assert result.returncode != 0
    assert "endpoint" in result.stdout and "replicas" in result.stdout


def test_deploying_doc_names_files_that_exist() -> None:
    """The walk-throughs only use files that ship: every repository path in the doc exists."""
    doc = (ROOT / "docs" / "deploying.md").read_text()
    paths = set(re.findall(r"(?<![\w/.-])((?:configs|helm|proto|docs)/[\w./-]*\w)", doc))
    assert len(paths) > 10
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing


def test_gateway_ships_with_auth_and_a_network_policy() -> None:
    docs = render(EXAMPLES / "gateway-values.yaml")
    validate(docs)
    kinds = by_kind(docs)
    secrets = {s["metadata"]["name"]: s for s in kinds["Secret"]}
    token = base64.b64decode(secrets["plumb-otel-plumb-auth"]["data"]["token"]).decode()
    assert len(token) >= 32
    (workload,) = kinds["StatefulSet"]
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    assert volumes["otel-plumb-auth"]["secret"] == {
        "secretName": "plumb-otel-plumb-auth", "items": [{"key": "token", "path": "token"}]
    }
    config = yaml.safe_load(
        next(cm for cm in kinds["ConfigMap"] if cm["metadata"]["name"].endswith("-config"))["data"]["config.yaml"]
    )
    tokens = [{"token_file": "/etc/otel-plumb/auth/token"}]
    for listener in (config["receivers"]["grpc"], config["receivers"]["http"], config["metrics"]):
        assert listener["auth"] == {"bearer_tokens": tokens}
        assert "insecure" not in listener
    assert {"email", "card_number", "bearer_token", "api_key"} <= set(config["redaction"]["patterns"])
    (monitor,) = kinds["ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["authorization"]["credentials"] == {
        "name": "plumb-otel-plumb-auth", "key": "token"
    }
    (policy,) = kinds["NetworkPolicy"]
    assert policy["spec"]["podSelector"] == workload["spec"]["selector"]
    ports = [[p["port"] for p in rule["ports"]] for rule in policy["spec"]["ingress"]]
    assert ports == [[4317, 4318], [9464]]
    assert policy["spec"]["ingress"][0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}
    ]
    # The chart's own default: pods of the release's namespace only.
    (default,) = by_kind(render(EXAMPLES / "gateway-values.yaml", "--set", "networkPolicy.otlpFrom=null"))[
        "NetworkPolicy"
    ]
    assert [[p["port"] for p in rule["ports"]] for rule in default["spec"]["ingress"]] == [[9464]]


def test_chart_tls_existing_secret_and_insecure() -> None:
    docs = render(
        EXAMPLES / "gateway-values.yaml",
        "--set", "tls.enabled=true", "--set", "tls.secretName=plumb-tls", "--set", "tls.clientAuth=true",
        "--set", "auth.existingSecret=plumb-token", "--set", "auth.tenant=team-a",
    )  # fmt: skip
    validate(docs)
    kinds = by_kind(docs)
    assert "plumb-otel-plumb-auth" not in {s["metadata"]["name"] for s in kinds.get("Secret", [])}
    config = yaml.safe_load(
        next(cm for cm in kinds["ConfigMap"] if cm["metadata"]["name"].endswith("-config"))["data"]["config.yaml"]
    )
    grpc = config["receivers"]["grpc"]
    assert grpc["auth"]["bearer_tokens"] == [{"token_file": "/etc/otel-plumb/auth/token", "tenant": "team-a"}]
    assert grpc["tls"] == {
        "cert_file": "/etc/otel-plumb/tls/tls.crt", "key_file": "/etc/otel-plumb/tls/tls.key",
        "client_ca_file": "/etc/otel-plumb/tls/ca.crt",
    }
    loaded = load_config(None, {k: config[k] for k in ("receivers", "metrics")})
    assert loaded.receivers.grpc.tls is not None and exposure_errors(loaded) == []
    # Probes cannot present a client certificate: metrics has TLS, not mTLS (and the token).
    assert "client_ca_file" not in config["metrics"]["tls"] and config["metrics"]["auth"]
    (workload,) = kinds["StatefulSet"]
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    assert volumes["otel-plumb-tls"]["secret"]["secretName"] == "plumb-tls"
    assert volumes["otel-plumb-auth"]["secret"]["secretName"] == "plumb-token"

    # Unprotected only when asked for, and then said so in the config.
    refused = helm("template", "plumb", str(CHART), "--set", "auth.enabled=false", "--set", "tls.enabled=false")
    assert refused.returncode != 0 and "insecure" in refused.stderr
    docs = render(
        EXAMPLES / "gateway-values.yaml",
        "--set", "auth.enabled=false", "--set", "tls.enabled=false", "--set", "insecure=true",
    )  # fmt: skip
    config = yaml.safe_load(
        next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config"))["data"][
            "config.yaml"
        ]
    )
    assert config["receivers"]["grpc"]["insecure"] is True and "auth" not in config["receivers"]["grpc"]
    assert exposure_errors(load_config(None, {k: config[k] for k in ("receivers", "metrics")})) == []


async def test_the_chart_serves_tls_by_default_with_a_certificate_clients_can_verify(tmp_path: Path) -> None:
    """The gateway's default: a generated CA and certificate for the Service's names. A real
    processor on the rendered config (paths moved under tmp_path, ports on loopback) completes a
    verified handshake for the Service name and takes spans from the OTel SDK exporter given
    ca.crt and the token; a client that does not trust ca.crt fails the handshake."""
    docs = render(EXAMPLES / "gateway-values.yaml")
    validate(docs)
    kinds = by_kind(docs)
    secrets = {s["metadata"]["name"]: s for s in kinds["Secret"]}
    tls_secret = secrets["plumb-otel-plumb-tls"]
    assert tls_secret["type"] == "kubernetes.io/tls"
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (tmp_path / key).write_bytes(base64.b64decode(tls_secret["data"][key]))
    token = base64.b64decode(secrets["plumb-otel-plumb-auth"]["data"]["token"]).decode()
    (tmp_path / "token").write_text(token)
    (workload,) = kinds["StatefulSet"]
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    assert volumes["otel-plumb-tls"]["secret"]["secretName"] == "plumb-otel-plumb-tls"
    (monitor,) = kinds["ServiceMonitor"]
    tls_config = monitor["spec"]["endpoints"][0]["tlsConfig"]
    assert tls_config["ca"]["secret"]["name"] == "plumb-otel-plumb-tls"
    assert tls_config["serverName"] == "plumb-otel-plumb-headless.agents.svc"

    rendered = next(cm for cm in kinds["ConfigMap"] if cm["metadata"]["name"].endswith("-config"))
    text = rendered["data"]["config.yaml"].replace("/etc/otel-plumb/tls", str(tmp_path))
    config = yaml.safe_load(text.replace("/etc/otel-plumb/auth/token", str(tmp_path / "token")))
    for section in (config["receivers"]["grpc"], config["receivers"]["http"], config["metrics"]):
        assert section["tls"]["cert_file"] == str(tmp_path / "tls.crt")
        section["endpoint"] = "127.0.0.1:0"
    for key in ("policies", "exporters", "verdict_log"):
        config.pop(key, None)

    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from otel_plumb.processor import Processor

    processor = Processor(load_config(None, config))
    await processor.start()
    try:
        ca = (tmp_path / "ca.crt").read_bytes()
        context = ssl.create_default_context(cadata=ca.decode())
        port = processor.metrics_port or 0

        def scrape() -> tuple[int, str]:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
            try:
                # The name Prometheus checks (serverName), on the pod IP it scrapes.
                conn.sock = context.wrap_socket(
                    socket.create_connection(("127.0.0.1", port), timeout=5),
                    server_hostname="plumb-otel-plumb-headless.agents.svc",
                )
                conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"})
                response = conn.getresponse()
                return response.status, response.read().decode()
            finally:
                conn.close()

        status, _ = await asyncio.to_thread(scrape)
        assert status == 200
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.to_thread(
                lambda: ssl.create_default_context().wrap_socket(
                    socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="localhost"
                )
            )

        def send() -> None:
            exporter = OTLPSpanExporter(
                endpoint=f"localhost:{processor.grpc_port}",
                credentials=grpc.ssl_channel_credentials(root_certificates=ca),
                headers={"authorization": f"Bearer {token}"},
            )
            provider = TracerProvider(resource=Resource.create({"service.name": "tls-default"}))
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            with provider.get_tracer("t").start_as_current_span("hello"):
                pass
            provider.shutdown()

        await asyncio.to_thread(send)
        deadline = time.monotonic() + 10
        while processor.metrics.spans_received.labels("grpc")._value.get() < 1:
            assert time.monotonic() < deadline, "the span never arrived"
            await asyncio.sleep(0.05)
    finally:
        await processor.stop()


def test_alerts_and_dashboard_link_to_console_pages() -> None:
    """Alerts carry a `console` annotation at the chart's console.baseUrl; dashboard panels link
    to console pages through the console_url variable; every linked page is a console route."""
    (rule,) = by_kind(render(EXAMPLES / "gateway-values.yaml", "--set", "console.baseUrl=https://plumb.example/"))[
        "PrometheusRule"
    ]
    consoles = {r["alert"]: r["annotations"]["console"] for g in rule["spec"]["groups"] for r in g["rules"]
                if "console" in r.get("annotations", {})}  # fmt: skip
    assert set(consoles) == {
        "PlumbConformanceBelowObjective", "PlumbIndeterminateShareRising", "PlumbCriticalViolation",
        "PlumbPathAgreementDropped",
    }  # fmt: skip
    assert all(url.startswith("https://plumb.example/") and "127.0.0.1" not in url for url in consoles.values())

    from otel_plumb.console.app import console_app

    routes = set()
    board = json.loads((ROOT / "configs" / "grafana" / "otel-plumb-dashboard.json").read_text())
    assert "console_url" in {v["name"] for v in board["templating"]["list"]}
    defaults = [p.get("fieldConfig", {}).get("defaults", {}) for p in board["panels"]]
    links = [link["url"] for d in defaults for link in d.get("links", [])]
    assert len(links) >= 3 and all(url.startswith("${console_url}/") for url in links)
    for url in [*links, *consoles.values()]:
        routes.add(urllib.parse.urlsplit(url.replace("${console_url}", "http://x")).path)
    import sqlite3
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        sqlite3.connect(Path(tmp) / "s.sqlite").close()
        app = console_app(Path(tmp) / "s.sqlite")
        known = {r.resource.canonical for r in app.router.routes() if r.resource is not None}
    assert routes <= known, routes - known
