"""``otel-plumb watch``: verdicts from a running processor's Watch stream, as they are decided."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from otel_plumb.cli.main import RunError


def _line(t: Any) -> str:
    """One line per decision: status, task key, trace, the failed invariants."""
    from otel_plumb.terminal import safe

    failed = [f"{v.invariant} ({v.severity})" for v in t.verdicts if v.verdict == "fail"]
    key = "" if t.key in ("", t.trace_id) else f"{safe(t.key)} "
    early = "early " if t.decision == "early" else ""
    agent = safe(t.agent) if t.HasField("agent") else "-"
    detail = ", ".join(safe(f) for f in failed) or f"{len(t.steps)} steps"
    return f"{early}{t.status:<13} {key}{t.trace_id[:16]}  {agent}  {detail}"


@click.command()
@click.argument("target", metavar="grpc://HOST:PORT")
@click.option("--policy", "policies", multiple=True, metavar="P", help="Only trajectories checked by policy P.")
@click.option("--status", "statuses", multiple=True, help="Only these statuses (violating, indeterminate, ...).")
@click.option("--agent", "agents", multiple=True, help="Only these agents.")
@click.option("--final", is_flag=True, help="Only final decisions (not the early failures of running trajectories).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per decision (the Trajectory message).")
@click.option("--token-env", default="OTEL_PLUMB_TOKEN", show_default=True, metavar="NAME",
              help="The environment variable holding the bearer token, when the listener requires one.")
@click.option("--ca-file", type=click.Path(dir_okay=False), help="For grpcs://: the CA the processor's certificate "
              "chains to (default: the system's).")  # fmt: skip
@click.option("--cert-file", type=click.Path(dir_okay=False), help="For mTLS: this client's certificate.")
@click.option("--key-file", type=click.Path(dir_okay=False), help="For mTLS: its key.")
def watch(
    target: str, policies: tuple[str, ...], statuses: tuple[str, ...], agents: tuple[str, ...], final: bool,
    as_json: bool, token_env: str, ca_file: str | None, cert_file: str | None, key_file: str | None,
) -> None:  # fmt: skip
    """Print verdicts from a running processor (grpc://, or grpcs:// for TLS) as they are decided."""
    import grpc
    from google.protobuf.json_format import MessageToJson

    from otel_plumb.proto_gen import watch_pb2, watch_pb2_grpc

    if not target.startswith(("grpc://", "grpcs://")):
        raise RunError(f"{target}: give grpc://HOST:PORT or grpcs://HOST:PORT")
    address = target.removeprefix("grpcs://").removeprefix("grpc://")
    if target.startswith("grpcs://"):
        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as exc:
                raise RunError(f"{path}: {exc.strerror or exc}") from None

        credentials = grpc.ssl_channel_credentials(read(ca_file), read(key_file), read(cert_file))
        channel = grpc.secure_channel(address, credentials)
    else:
        channel = grpc.insecure_channel(address)
    token = os.environ.get(token_env)
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    request = watch_pb2.WatchRequest(policies=list(policies), statuses=list(statuses), agents=list(agents),
                                     decisions=["final"] if final else [])  # fmt: skip
    stub = watch_pb2_grpc.VerdictServiceStub(channel)  # type: ignore[no-untyped-call]
    try:
        for message in stub.Watch(request, metadata=metadata):
            click.echo(MessageToJson(message, indent=None) if as_json else _line(message))
            sys.stdout.flush()
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        if code == grpc.StatusCode.UNAUTHENTICATED:
            raise RunError(f"{target}: not authenticated: set {token_env} to a token the processor accepts") from None
        raise RunError(f"{target}: {exc.details() if hasattr(exc, 'details') else exc}") from None
    except KeyboardInterrupt:
        pass
    finally:
        channel.close()
