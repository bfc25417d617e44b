"""Campaign files (SPEC section 8): pydantic models, loaded from YAML with line numbers.

Every error names the file, the line and what is wrong, before anything runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from otel_plumb import yamlfile


class CampaignError(Exception):
    """A campaign file (or a file it names) cannot be used."""

    def __init__(self, path: str | Path, line: int | None, message: str) -> None:
        self.path, self.line, self.message = str(path), line, message
        super().__init__(f"{path}:{line}: {message}" if line else f"{path}: {message}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HttpArm(_Model):
    url: str = Field(pattern=r"^https?://")
    timeout_s: float = Field(default=60.0, gt=0)
    retries: int = Field(default=2, ge=0, description="retries on connection errors only")
    headers: dict[str, str] = Field(default_factory=dict)


class CommandArm(_Model):
    argv: list[str] = Field(min_length=1)
    timeout_s: float = Field(default=60.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)


class PythonArm(_Model):
    callable: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class Arm(_Model):
    http: HttpArm | None = None
    command: CommandArm | None = None
    python: PythonArm | None = None
    # The protocol of the receiver the request's ``otlp_endpoint`` (and a command's
    # OTEL_EXPORTER_OTLP_ENDPOINT) names; unset: grpc, the OpenTelemetry Python SDK's default.
    # Unset is left out of the trial identity, so naming it later keeps cached answers.
    otlp_protocol: Literal["grpc", "http/protobuf"] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Arm:
        if sum(x is not None for x in (self.http, self.command, self.python)) != 1:
            raise ValueError("an arm is exactly one of http, command or python")
        return self


class WatchTLS(_Model):
    """TLS to a processor's gRPC listener (grpcs://); paths relative to the campaign file."""

    # The CA that signed the processor's certificate; none: the system's.
    ca_file: str | None = None
    # A client certificate and its key, when the listener wants one (client_ca_file).
    cert_file: str | None = None
    key_file: str | None = None


class Traces(_Model):
    receiver: Literal["embedded"] | None = None
    watch: str | None = Field(default=None, pattern=r"^grpcs?://[^/]+:\d+$")
    # With a grpcs:// watch: the CA and client certificate to use.
    tls: WatchTLS | None = None
    files: list[str] | None = None
    # With watch: the processor's bearer token, usually ${env:NAME} (expanded when the campaign runs).
    token: str | None = Field(default=None, min_length=1, repr=False)
    # How long after the agent answered its trajectory may take to arrive.
    deadline_s: float = Field(default=10.0, gt=0)

    @model_validator(mode="after")
    def _one_source(self) -> Traces:
        if sum(x is not None for x in (self.receiver, self.watch, self.files)) != 1:
            raise ValueError("traces is exactly one of receiver: embedded, watch: grpc(s)://host:port, files: [...]")
        if self.token is not None and self.watch is None:
            raise ValueError("traces.token goes with traces.watch")
        if self.tls is not None and not (self.watch or "").startswith("grpcs://"):
            raise ValueError("traces.tls goes with traces.watch: grpcs://host:port")
        if self.tls is not None and (self.tls.cert_file is None) != (self.tls.key_file is None):
            raise ValueError("traces.tls: cert_file and key_file go together")
        return self


class Baseline(_Model):
    repeats: int = Field(default=5, ge=1)


class ParaphraseSource(_Model):
    # "file", "openai" (any OpenAI-compatible server), or a plugin registered under the
    # entry-point group ``otel_plumb.paraphrase``.
    provider: str
    path: str | None = None
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    candidates: int = Field(default=4, ge=1, description="paraphrases asked of a generator per case")
    temperature: float = Field(default=0.7, ge=0)
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _needs(self) -> ParaphraseSource:
        if self.provider == "file" and not self.path:
            raise ValueError("provider: file needs path")
        if self.provider == "openai" and not (self.base_url and self.model):
            raise ValueError("provider: openai needs base_url and model")
        return self


class Guard(_Model):
    # "embedding": cosine similarity of sentence embeddings (all-MiniLM-L6-v2, shipped in a
    # PyPI package); "judge": a second model asked whether the meaning is the same; "none".
    provider: Literal["embedding", "judge", "none"] = "embedding"
    min_similarity: float = Field(default=0.85, ge=-1, le=1)
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None

    @model_validator(mode="after")
    def _needs(self) -> Guard:
        if self.provider == "judge" and not (self.base_url and self.model):
            raise ValueError("guard provider: judge needs base_url and model")
        return self


class Paraphrase(_Model):
    source: ParaphraseSource
    samples: int = Field(default=2, ge=1)
    # Unset: reviewed paraphrases from a file are used as written, model-generated ones (openai,
    # plugins) go through the embedding guard at its default threshold. See ``effective_guard``.
    guard: Guard | None = None

    @property
    def effective_guard(self) -> Guard:
        if self.guard is not None:
            return self.guard
        return Guard(provider="none") if self.source.provider == "file" else Guard()


def guard_record(paraphrase: Paraphrase) -> dict[str, Any]:
    """Which guard checks the paraphrases, with its threshold, and whether the file said so."""
    guard = paraphrase.effective_guard
    return {
        "provider": guard.provider,
        "min_similarity": guard.min_similarity if guard.provider == "embedding" else None,
        "model": guard.model if guard.provider == "judge" else None,
        "configured": paraphrase.guard is not None,
        "source": paraphrase.source.provider,
    }


class Distractor(_Model):
    fragments: list[str] = Field(min_length=1)
    insertions: int = Field(default=1, ge=1)
    samples: int = Field(default=2, ge=1)


class DecoyTool(_Model):
    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class DecoyTools(_Model):
    tools: list[DecoyTool] = Field(min_length=1)
    per_variant: int = Field(default=1, ge=1)
    samples: int = Field(default=2, ge=1)


class ToolFault(_Model):
    targets: list[str] = Field(min_length=1)
    errors: list[str] = Field(min_length=1)
    times: int = Field(default=1, ge=1)
    samples: int = Field(default=2, ge=1)


class Sampling(_Model):
    temperature: float = Field(ge=0)
    samples: int = Field(default=3, ge=1)


class Perturbations(_Model):
    baseline: Baseline | None = None
    paraphrase: Paraphrase | None = None
    distractor: Distractor | None = None
    decoy_tools: DecoyTools | None = None
    tool_fault: ToolFault | None = None
    sampling: Sampling | None = None


class Limits(_Model):
    max_trials: int | None = Field(default=None, ge=1)
    max_duration_s: float | None = Field(default=None, gt=0)
    concurrency: int = Field(default=4, ge=1)


class Gates(_Model):
    min_certified_bound: float | None = Field(default=None, ge=0, le=1)
    max_violations: int | None = Field(default=None, ge=0)


class Campaign(_Model):
    campaign: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = 0
    dataset: str
    policies: list[str] = Field(min_length=1)
    arms: dict[str, Arm] = Field(min_length=1)
    traces: Traces
    perturbations: Perturbations = Perturbations()
    trials: int = Field(default=1, ge=1, description="trials per arm and variant")
    limits: Limits = Limits()
    gates: Gates = Gates()

    @model_validator(mode="after")
    def _arm_names(self) -> Campaign:
        for name in self.arms:
            if not name or not all(c.isalnum() or c in "_.-" for c in name):
                raise ValueError(f"arm name {name!r} must be [A-Za-z0-9_.-]+")
        return self


class LoadedCampaign:
    """A validated campaign with its folder (paths in the file are relative to it)."""

    def __init__(self, spec: Campaign, path: Path, raw: dict[str, Any]) -> None:
        self.spec = spec
        self.path = path
        self.folder = path.parent
        self.raw = raw

    def resolve(self, relative: str) -> Path:
        p = Path(relative)
        return p if p.is_absolute() else self.folder / p


def load_yaml_with_lines(path: Path) -> tuple[Any, dict[tuple[Any, ...], int]]:
    """Parse YAML keeping the line (1-based) of every mapping key and sequence item, through the
    one YAML loader (``otel_plumb.yamlfile``: size limit, duplicate keys refused, bounded aliases)."""
    try:
        doc = yamlfile.load(path)
    except yamlfile.YamlError as e:
        raise CampaignError(path, e.line, e.message) from None
    return doc.data, dict(doc.lines)


def line_for(lines: dict[tuple[Any, ...], int], loc: tuple[Any, ...]) -> int | None:
    """The line of the deepest existing prefix of ``loc`` (a missing key points at its parent)."""
    for cut in range(len(loc), -1, -1):
        if (found := lines.get(tuple(loc[:cut]))) is not None:
            return found
    return None


def validation_error(path: Path, lines: dict[tuple[Any, ...], int], err: ValidationError) -> CampaignError:
    # An unknown key explains the rest (a misspelt key is also "missing"): report it first.
    errors = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    loc = tuple(x for x in first["loc"] if not (isinstance(x, str) and x in _UNION_TAGS))
    where = ".".join(str(x) for x in loc) or "(top level)"
    if first["type"] == "extra_forbidden":
        message = f"unknown key {loc[-1]!r} at {where}"
    elif first["type"] == "missing":
        message = f"missing key {where}"
    else:
        message = f"{where}: {first['msg']}"
    more = len(errors) - 1
    if more:
        message += f" (and {more} more problem{'s' if more > 1 else ''})"
    return CampaignError(path, line_for(lines, loc), message)


# pydantic puts union member names into error locations; they are not keys of the file.
_UNION_TAGS = frozenset({"function-after[_one_kind(), Arm]", "function-after[_one_source(), Traces]"})


def load_campaign(path: str | Path) -> LoadedCampaign:
    p = Path(path)
    data, lines = load_yaml_with_lines(p)
    if not isinstance(data, dict):
        raise CampaignError(p, 1, "a campaign file is a YAML mapping")
    try:
        spec = Campaign.model_validate(data)
    except ValidationError as e:
        raise validation_error(p, lines, e) from None
    loaded = LoadedCampaign(spec, p.resolve(), data)
    for i, policy in enumerate(spec.policies):
        if not loaded.resolve(policy).is_file():
            raise CampaignError(p, lines.get(("policies", i)), f"policy file not found: {policy}")
    if not loaded.resolve(spec.dataset).is_file():
        raise CampaignError(p, lines.get(("dataset",)), f"dataset not found: {spec.dataset}")
    return loaded


class Case:
    __slots__ = ("context", "id", "input", "line")

    def __init__(self, case_id: str, text: str, context: dict[str, Any], line: int) -> None:
        self.id = case_id
        self.input = text
        self.context = context
        self.line = line


def jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, decoded row) for each non-blank line; unreadable files and bad JSON are
    CampaignErrors naming the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise CampaignError(path, None, f"cannot read: {e.strerror or e}") from e
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            raise CampaignError(path, n, f"invalid JSON: {e.msg}") from None


def load_dataset(path: Path) -> list[Case]:
    """JSONL rows ``{"id", "input", "context"}``; a bad row is an error with its line."""
    cases: list[Case] = []
    seen: set[str] = set()
    for n, row in jsonl_rows(path):
        if not isinstance(row, dict) or not isinstance(row.get("id"), (str, int)) or not isinstance(
            row.get("input"), str
        ):
            raise CampaignError(path, n, 'a case is {"id": ..., "input": "...", "context": {...}}')
        unknown = set(row) - {"id", "input", "context"}
        if unknown:
            raise CampaignError(path, n, f"unknown key {sorted(unknown)[0]!r}")
        context = row.get("context") or {}
        if not isinstance(context, dict):
            raise CampaignError(path, n, "context must be an object")
        case_id = str(row["id"])
        if case_id in seen:
            raise CampaignError(path, n, f"duplicate case id {case_id!r}")
        seen.add(case_id)
        cases.append(Case(case_id, row["input"], context, n))
    if not cases:
        raise CampaignError(path, None, "the dataset has no cases")
    return cases
