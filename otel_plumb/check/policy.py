"""Loading (validate everything, compile once) and evaluating policies."""

from __future__ import annotations

import os
from collections.abc import Callable, Container, Iterable, Sequence
from typing import Any, Final

import re2
from pydantic import ValidationError

from otel_plumb import yamlfile
from otel_plumb.check import checks as ck
from otel_plumb.check import schema as sc
from otel_plumb.check.errors import PolicyError
from otel_plumb.check.expr import BUDGET_EXCEEDED, BudgetExceeded, EvaluationError, Expression, ExpressionError
from otel_plumb.check.reference import MatchesReference, context_reference, file_reference, reference_calls
from otel_plumb.check.regex import Regex
from otel_plumb.check.source import LocatedYaml, read_located
from otel_plumb.check.values import MISSING, lookup, parse_path
from otel_plumb.model import Severity, Step, Trajectory, Verdict
from otel_plumb.model.trajectory import DATA_LOST, TRANSFER_PREFIX, UNRECOGNISED_SPANS
from otel_plumb.redact.config import RedactionRules

GUARD_VARIABLES: Final[tuple[str, ...]] = ("ctx", "steps", "trajectory")
ARG_VARIABLES: Final[tuple[str, ...]] = ("args", "result", "ctx", "step", "steps", "trajectory")


def budget_exceeded(verdict: Verdict) -> bool:
    """An indeterminate verdict because the trajectory's CEL cost budget ran out (to count it)."""
    return verdict.verdict == "indeterminate" and verdict.message.startswith(BUDGET_EXCEEDED)


def regex_problem(exc: Exception) -> str:
    arg = exc.args[0] if exc.args else exc
    return arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)


class Glob:
    """``applies_to`` globs: every given field must match (``*``, ``?``, ``[...]`` as in fnmatch,
    case-sensitive), matched with RE2 since the names come from spans."""

    __slots__ = ("agent", "service")

    def __init__(self, spec: sc.AppliesTo) -> None:
        self.service = _glob(spec.service)
        self.agent = _glob(spec.agent)

    def matches(self, trajectory: Trajectory) -> bool:
        return _glob_ok(self.service, trajectory.service) and _glob_ok(self.agent, trajectory.agent)

    def matches_in_flight(self, services: Iterable[str]) -> bool:
        """Whether it matches a trajectory still in flight whose spans so far came from these
        services, whatever its root (which arrives last) turns out to be: a service glob that
        every one of them matches, as a trace of one process has one service. Never an agent
        glob: the agent a trajectory is, is its first agent step, usually the root (a
        supervisor's sub-agent may match where the supervisor does not), so invariants under
        one are not checked in flight at all."""
        if self.agent is not None:
            return False
        if self.service is None:
            return True
        names = list(services)
        return bool(names) and all(self.service.found(n) for n in names)


def _glob(pattern: str | None) -> Regex | None:
    return None if pattern is None else Regex(glob_regex(pattern))


def glob_regex(pattern: str) -> str:
    """An fnmatch glob as an RE2 pattern matching the whole text."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append(r"\[")
                continue
            body = pattern[i:j]
            i = j + 1
            negate = body.startswith("!")
            body = body[1:] if negate else body
            body = body.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")
            if body.startswith("^"):
                body = "\\" + body
            out.append(f"[{'^' if negate else ''}{body}]")
        else:
            out.append(c if c.isalnum() else re2.escape(c))
    return r"\A(?s:" + "".join(out) + r")\z"


def _glob_ok(pattern: Regex | None, value: str | None) -> bool:
    return pattern is None or (value is not None and pattern.found(value))


class Scope:
    """Limits a check to part of the trajectory, anchored on successful calls."""

    __slots__ = ("ends", "kind", "start", "stop")

    def __init__(self, spec: sc.Scope) -> None:
        if spec.after is not None:
            self.kind, self.start, self.stop = "after", _tools(spec.after), frozenset[str]()
        elif spec.before is not None:
            self.kind, self.start, self.stop = "before", frozenset[str](), _tools(spec.before)
        else:
            assert spec.between is not None
            self.kind, self.start, self.stop = "between", _tools(spec.between[0]), _tools(spec.between[1])
        self.ends = self.start | self.stop

    def select(self, steps: Sequence[Step]) -> Sequence[Step] | None:
        """The steps in scope, or None when the scope's opening call never happened."""
        lo = 0
        if self.start:
            i = _first_call(steps, self.start, 0)
            if i is None:
                return None
            lo = i + 1
        hi = len(steps)
        if self.stop:
            j = _first_call(steps, self.stop, lo)
            hi = len(steps) if j is None else j
        return steps[lo:hi]

    def text(self) -> str:
        if self.kind == "after":
            return f"after {ck.tools_text(self.start)}"
        if self.kind == "before":
            return f"before {ck.tools_text(self.stop)}"
        return f"between {ck.tools_text(self.start)} and {ck.tools_text(self.stop)}"


def _first_call(steps: Sequence[Step], tools: ck.Tools, start: int) -> int | None:
    for i in range(start, len(steps)):
        s = steps[i]
        if s.kind == "tool" and s.error is None and s.name in tools:
            return i
    return None


def _tools(ref: sc.ToolRef) -> ck.Tools:
    return frozenset([ref] if isinstance(ref, str) else ref)


class CompiledInvariant:
    __slots__ = ("applies", "check", "description", "guard", "id", "kind", "policy", "scope", "severity")

    def __init__(
        self,
        policy: str,
        spec: sc.Invariant,
        kind: str,
        check: ck.Check,
        guard: Expression | None,
    ) -> None:
        self.policy = policy
        self.id = spec.id
        self.severity: Severity = spec.severity
        self.description = spec.description
        self.kind = kind
        self.check = check
        self.guard = guard
        self.applies = Glob(spec.applies_to) if spec.applies_to is not None else None
        self.scope = Scope(spec.scope) if spec.scope is not None else None

    @property
    def early(self) -> bool:
        """Can a fail on a partial trajectory be reported now? Only for kinds whose fails more
        spans cannot undo, without a ``when`` guard or an ``applies_to`` agent (the span
        carrying the ground truth a guard reads tends to arrive last, and the agent a trajectory
        is, is its root's: see ``Glob.matches_in_flight``), with no scope or one that more spans can only widen, and for
        ``precedes`` when no call it needs before the ``then`` call may still turn into a
        handoff (a ``transfer_to_<agent>`` call, once that agent's span arrives)."""
        scope_ok = self.scope is None or self.scope.kind == "after"
        if isinstance(self.check, ck.Precedes):
            needed = self.check.first | (self.scope.start if self.scope is not None else frozenset())
            if any(t.startswith(TRANSFER_PREFIX) for t in needed):
                return False
        agent_unknown = self.applies is not None and self.applies.agent is not None
        return self.check.early and self.guard is None and scope_ok and not agent_unknown

    def verdict(self, outcome: ck.Outcome, run: ck.Run) -> Verdict:
        """The verdict of ``outcome``; on a provisional run it names the step by span only."""
        s = outcome.step
        return Verdict(
            invariant=self.id,
            policy=self.policy,
            verdict=outcome.verdict,
            severity=self.severity,
            step_index=s.index if s is not None and not run.provisional else None,
            span_id=s.span_id if s is not None else None,
            message=outcome.message,
            expected=outcome.expected,
            got=outcome.got,
        )

    def _run_in_scope(self, run: ck.Run, steps: Sequence[Step]) -> ck.Outcome:
        assert self.scope is not None
        scoped = self.scope.select(steps)
        if scoped is None:
            if not run.complete:
                return ck.Outcome("indeterminate", None, f"scope {self.scope.text()} not opened yet; "
                                  "the trajectory is incomplete")  # fmt: skip
            return ck.Outcome("not_applicable", None, f"scope {self.scope.text()}: never happened")
        return self.check.run(run, scoped)

    def evaluate(self, run: ck.Run) -> Verdict:
        return self.verdict(self.outcome(run), run)

    def outcome(self, run: ck.Run) -> ck.Outcome:
        t = run.trajectory
        if self.applies is not None and not self.applies.matches(t):
            return ck.Outcome("not_applicable", None, f"not for service {t.service!r}, agent {t.agent!r}")
        if self.guard is not None:
            hidden = run.stand_in_read_by(self.guard, t.steps)
            if hidden is not None:
                # Whether the invariant applies depends on a value the data does not hold.
                return ck.Outcome("indeterminate", None, f"when {self.guard.source}: {hidden[1]}, which it reads")
            try:
                active = self.guard.test(run.activation(self.guard, t.steps), run.budget)
            except BudgetExceeded as over:
                return ck.Outcome("indeterminate", None, f"{over} (when)")
            except EvaluationError as exc:
                return ck.Outcome("indeterminate", None, f"when {self.guard.source}: {exc}")
            if not active:
                if not run.complete:  # spans still to come may add a step it looks for, name the agent
                    why = f"trajectory {run.reason or 'incomplete'}: spans still to come may change it"
                    return ck.Outcome("indeterminate", None, f"when {self.guard.source} is false so far; {why}")
                return ck.Outcome("not_applicable", None, f"when {self.guard.source} is false")
        if self.scope is None:
            out = self.check.run(run, t.steps)
        else:
            out = ck.over_unsure_calls(run, t.steps, self.scope.ends, self._run_in_scope)
        # On an incomplete trajectory more spans could still undo a pass, or a fail of a non-monotone
        # check, or (when spans were lost, not just not yet arrived) a fail that needs an earlier step.
        # And a fail that spans still to come may take out of the check's reach: an earlier
        # closing call narrows a ``before``/``between`` scope, and a guard may turn false (a step
        # it looks for, the agent the root names, context attributes the root carries).
        lost = run.reason in DATA_LOST
        if not run.complete and (
            out.verdict == "pass"
            or (out.verdict == "fail" and not self.check.final_fail)
            or (out.verdict == "fail" and lost and not self.check.fail_survives_lost_data)
            or (out.verdict == "fail" and self.scope is not None and self.scope.kind != "after")
            or (out.verdict == "fail" and self.guard is not None)
        ):
            reason = run.reason or "incomplete"
            detail = f" ({out.message})" if out.message else ""
            return ck.Outcome(
                "indeterminate", out.step, f"trajectory {reason}: would be {out.verdict}{detail}", out.expected, out.got
            )
        return out


# Conventions of spans that may hide a tool call: none read them.
_UNREAD_CONVENTIONS: Final = frozenset({"unknown", "unrecognised"})
# Span names whose tools a policy remembers at once.
_SPAN_NAMES_MAX: Final = 10_000


class ToolNames:
    """Whether a span name holds the name of a tool some policy checks: a span no convention
    reads that does may hide that tool's call (``CompiledPolicy.unread_tool_span``), so its
    trace is built in full (``assemble.plain_trajectory`` asks this of every span of a trace
    that is no agent's run). Span names repeat: each answer is remembered, boundedly."""

    __slots__ = ("_known", "_tools")

    def __init__(self, policies: Iterable[CompiledPolicy]) -> None:
        self._tools = sorted({t for p in policies for t in p.tool_names})
        self._known: dict[str, bool] = {}

    def __call__(self, span_name: str) -> bool:
        if not self._tools:
            return False
        known = self._known.get(span_name)
        if known is None:
            if len(self._known) >= _SPAN_NAMES_MAX:
                self._known.clear()
            known = self._known[span_name] = any(t in span_name for t in self._tools)
        return known


class CompiledPolicy:
    """A validated policy, compiled once: call ``evaluate`` per trajectory."""

    def __init__(
        self,
        name: str,
        path: str,
        invariants: list[CompiledInvariant],
        applies: Glob | None,
        context_prefix: str,
        task_attribute: str | None,
        context_file: dict[str, dict[str, Any]] | None,
        redaction: RedactionRules | None = None,
    ) -> None:
        self.name = name
        # What this policy adds to the redaction of what is emitted about its trajectories.
        self.redaction = redaction
        self.path = path
        self.invariants = invariants
        self._applies = applies
        self._prefix = context_prefix
        self._task_attribute = task_attribute
        self._context_file = context_file
        # An applies_to agent is known only from the root, which arrives last.
        self._early = [] if applies is not None and applies.agent is not None else [i for i in invariants if i.early]
        self._tools = tuple(sorted(self.tool_names))  # in name order: the one a problem line names is stable
        self._tools_by_span_name: dict[str, tuple[str, ...]] = {}

    def __repr__(self) -> str:
        return f"CompiledPolicy({self.name!r}, {len(self.invariants)} invariants)"

    def unread_tool_span(self, trajectory: Trajectory) -> str | None:
        """A problem line when a span no convention reads carries one of the policy's tool names
        (one not called in the trajectory: its calls are read; the root is the application's own
        span). O(steps): which tools a span name holds is worked out once per name."""
        if not self._tools:
            return None
        called: set[str] = set()
        candidates: list[tuple[Step, tuple[str, ...]]] = []
        for step in trajectory.steps:
            kind = step.kind
            if kind == "tool":
                called.add(step.name)
            elif kind == "other" and step.parent_span_id and step.convention in _UNREAD_CONVENTIONS:
                named = self._tools_in(step.name)
                if named:
                    candidates.append((step, named))
        for step, named in candidates:
            tool = next((t for t in named if t not in called), None)
            if tool is not None:
                return (f"span {step.span_id} ({step.name!r}) names the tool {tool!r} of policy {self.name} but "
                        "follows no convention otel-plumb reads: checks on which tools were called are "
                        "indeterminate")  # fmt: skip
        return None

    def _tools_in(self, span_name: str) -> tuple[str, ...]:
        """The policy's tools whose names are in ``span_name``, in name order (span names repeat:
        remembered, boundedly)."""
        named = self._tools_by_span_name.get(span_name)
        if named is None:
            if len(self._tools_by_span_name) >= _SPAN_NAMES_MAX:
                self._tools_by_span_name.clear()
            named = self._tools_by_span_name[span_name] = tuple(t for t in self._tools if t in span_name)
        return named

    @property
    def applies(self) -> Glob | None:
        """The policy's ``applies_to`` globs, if it has them."""
        return self._applies

    @property
    def early_invariants(self) -> list[CompiledInvariant]:
        """The invariants checked on trajectories in flight (see ``CompiledInvariant.early``)."""
        return self._early

    @property
    def tool_names(self) -> frozenset[str]:
        """Every tool an invariant names (coverage looks for them in spans no convention reads)."""
        names: set[str] = set()
        for inv in self.invariants:
            # The tool sets a check keeps, whatever its kind calls them.
            for field in ("tools", "first", "then", "trigger"):
                value = getattr(inv.check, field, None)
                if isinstance(value, frozenset):
                    names |= value
        return frozenset(names)

    @property
    def task_attribute(self) -> str | None:
        """The trajectory attribute naming the task (``task.attribute``), if the policy has one."""
        return self._task_attribute

    def applies_to(self, trajectory: Trajectory) -> bool:
        return self._applies is None or self._applies.matches(trajectory)

    def task_id(self, trajectory: Trajectory) -> str | None:
        if self._task_attribute is None:
            return None
        value = trajectory.attributes.get(self._task_attribute)
        return None if value is None else str(value)

    def context(self, trajectory: Trajectory) -> dict[str, Any]:
        """Ground truth: ``<prefix>*`` attributes, overridden by the context file's entry for
        the task (the file is the system of record; attributes are what the agent's side sent)."""
        ctx = trajectory.context(self._prefix)
        if self._context_file is not None:
            task = self.task_id(trajectory)
            if task is not None:
                ctx.update(self._context_file.get(task, {}))
        return ctx

    def evaluate(self, trajectory: Trajectory) -> list[Verdict]:
        unread = None if not trajectory.complete else self.unread_tool_span(trajectory)
        if unread is not None:
            # Unrecognised is not absent: a span named like one of the policy's tools that no
            # convention reads may be that tool's call.
            run = ck.Run(trajectory, self.context(trajectory), False, reason=UNRECOGNISED_SPANS)
            trajectory.problems.append(unread)
        else:
            run = ck.Run(trajectory, self.context(trajectory), trajectory.complete)
        return [inv.evaluate(run) for inv in self.invariants]

    def early_failures(
        self, trajectory: Trajectory, only: Container[tuple[str, str]] | None = None
    ) -> list[Verdict]:
        """Fails already certain on a partial, in-flight trajectory (see ``CompiledInvariant.early``);
        ``only``: of the early invariants with these (policy, invariant) keys (the others cannot
        fail yet: ``check.early.EarlyWatch.may_fail``).

        Its step indices are not final (spans that start earlier, the root first, arrive later),
        so these verdicts have no ``step_index``: they name the offending step by ``span_id``, and
        their messages by span and call ordinal."""
        if not self._early or not self.applies_to(trajectory):
            return []
        run = ck.Run(trajectory, self.context(trajectory), complete=False, provisional=True)
        out = []
        for inv in self._early:
            if only is not None and (self.name, inv.id) not in only:
                continue
            outcome = inv.outcome(run)
            if outcome.verdict == "fail":
                out.append(inv.verdict(outcome, run))
        return out


# ---- loading ---------------------------------------------------------------------------


def load_policy(path: str | os.PathLike[str]) -> CompiledPolicy:
    """Read, validate and compile one policy file. Raises ``PolicyError`` naming file and line."""
    path = os.fspath(path)
    doc = read_located(path)
    if not isinstance(doc.data, dict):
        raise PolicyError(
            path, 1, "a policy is a mapping with policy, invariants and optional applies_to, task, context"
        )
    try:
        spec = sc.PolicyFile.model_validate(doc.data)
    except ValidationError as exc:
        raise _validation_error(doc, exc) from None
    return _compile(doc, spec)


def load_policies(paths: Iterable[str | os.PathLike[str]]) -> list[CompiledPolicy]:
    """Load every policy; two policies with the same name are an error."""
    policies: list[CompiledPolicy] = []
    seen: dict[str, str] = {}
    for p in paths:
        policy = load_policy(p)
        if policy.name in seen:
            raise PolicyError(policy.path, None, f"policy name {policy.name!r} is also used by {seen[policy.name]}")
        seen[policy.name] = policy.path
        policies.append(policy)
    return policies


def _validation_error(doc: LocatedYaml, exc: ValidationError) -> PolicyError:
    problems: list[PolicyError] = []
    seen: set[tuple[int | None, str]] = set()
    errors = [(err, tuple(seg for seg in err["loc"] if isinstance(seg, int) or seg in doc_keys(doc, err["loc"])))
              for err in exc.errors()]  # fmt: skip
    # A union reports one error per member; the one that got deepest into the document says most.
    deepest = [(e, k) for e, k in errors if not any(len(o) > len(k) and o[: len(k)] == k for _, o in errors)]
    for err, keys in deepest:
        loc = err["loc"]
        where = ".".join(str(k) for k in keys)
        if err["type"] == "extra_forbidden":
            message = f"unknown key {loc[-1]!r}" + (
                f" in {'.'.join(str(k) for k in keys[:-1])}" if len(keys) > 1 else ""
            )
        else:
            message = f"{where}: {err['msg']}" if where else str(err["msg"])
        line = doc.line_of(loc)
        if (line, where) in seen:
            continue  # one message per place: a union reports once per member
        seen.add((line, where))
        problems.append(PolicyError(doc.path, line, message.replace("Value error, ", "")))
    first, *rest = problems
    return PolicyError(first.path, first.line, first.message, rest)


def doc_keys(doc: LocatedYaml, loc: Sequence[object]) -> set[str]:
    """The string segments of ``loc`` that are keys in the document (not union member names)."""
    out: set[str] = set()
    prefix: tuple[str | int, ...] = ()
    for seg in loc:
        if isinstance(seg, (str, int)) and (*prefix, seg) in doc.lines:
            prefix = (*prefix, seg)
            if isinstance(seg, str):
                out.add(seg)
    return out


def _compile(doc: LocatedYaml, spec: sc.PolicyFile) -> CompiledPolicy:
    problems: list[PolicyError] = []
    invariants: list[CompiledInvariant] = []
    ids: dict[str, int] = {}
    task_attribute = spec.task.attribute if spec.task is not None else None
    for i, inv in enumerate(spec.invariants):
        at: tuple[str | int, ...] = ("invariants", i)
        if inv.id in ids:
            problems.append(
                doc.error((*at, "id"), f"duplicate invariant id {inv.id!r} (also invariant {ids[inv.id] + 1})")
            )
            continue
        ids[inv.id] = i
        try:
            invariants.append(_compile_invariant(doc, spec.policy, inv, at, task_attribute))
        except PolicyError as exc:
            problems.append(exc)
    context_file = None
    if spec.context is not None and spec.context.file is not None:
        try:
            context_file = _read_context_file(doc, spec)
        except PolicyError as exc:
            problems.append(exc)
    if problems:
        first, *rest = problems
        raise PolicyError(first.path, first.line, first.message, rest)
    return CompiledPolicy(
        name=spec.policy,
        path=doc.path,
        invariants=invariants,
        applies=Glob(spec.applies_to) if spec.applies_to is not None else None,
        context_prefix=spec.context.attributes_prefix if spec.context is not None else "plumb.context.",
        task_attribute=task_attribute,
        context_file=context_file,
        redaction=spec.redaction,
    )


def _compile_invariant(
    doc: LocatedYaml, policy: str, inv: sc.Invariant, at: tuple[str | int, ...], task_attribute: str | None
) -> CompiledInvariant:
    try:
        kind = inv.kind()
    except ValueError as exc:
        raise doc.error(at, str(exc)) from None
    if inv.attempts is not None and kind != "never_call":
        raise doc.error((*at, "attempts"), "attempts only goes with never_call")

    def expression(source: str, loc: tuple[str | int, ...], allowed: Sequence[str]) -> Expression:
        try:
            return Expression(source, allowed)
        except ExpressionError as exc:
            raise doc.error(loc, str(exc)) from None

    def path(text: str, loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
        try:
            return parse_path(text)
        except ValueError as exc:
            raise doc.error(loc, str(exc)) from None

    guard = expression(inv.when, (*at, "when"), GUARD_VARIABLES) if inv.when is not None else None
    here = (*at, kind)
    check: ck.Check
    if inv.must_call is not None:
        ref = inv.must_call.tool if isinstance(inv.must_call, sc.ToolSpec) else inv.must_call
        check = ck.MustCall(_tools(ref))
    elif inv.never_call is not None:
        if isinstance(inv.never_call, sc.NeverCall):
            check = ck.NeverCall(_tools(inv.never_call.tool), inv.never_call.attempts or bool(inv.attempts))
        else:
            check = ck.NeverCall(_tools(inv.never_call), bool(inv.attempts))
    elif inv.call_count is not None:
        check = ck.CallCount(_tools(inv.call_count.tool), inv.call_count.min, inv.call_count.max)
    elif inv.precedes is not None:
        check = ck.Precedes(_tools(inv.precedes.first), _tools(inv.precedes.then))
    elif inv.responds is not None:
        check = ck.Responds(_tools(inv.responds.trigger), _tools(inv.responds.then))
    elif inv.arg_equals is not None:
        a = inv.arg_equals
        check = ck.ArgEquals(
            _tools(a.tool), a.arg, path(a.arg, (*here, "arg")), _expected_source(a, lambda t, k: path(t, (*here, k))),
            a.compare, a.tolerance, from_step=a.step is not None, from_trace=a.context is not None,
        )  # fmt: skip
    elif inv.arg_matches is not None:
        m = inv.arg_matches
        try:
            regex = Regex(m.regex)
        except re2.error as exc:
            raise doc.error(
                (*here, "regex"), f"regex {m.regex!r} does not compile with RE2: {regex_problem(exc)} (RE2 has no "
                "backreferences or lookaround; it matches in time linear in the text)",
            ) from None
        check = ck.ArgMatches(_tools(m.tool), m.arg, path(m.arg, (*here, "arg")), regex)
    elif inv.arg_satisfies is not None:
        e = inv.arg_satisfies
        check = ck.ArgSatisfies(_tools(e.tool), expression(e.expr, (*here, "expr"), ARG_VARIABLES))
    elif inv.budget is not None:
        limits = {k: v for k, v in inv.budget.model_dump().items() if v is not None}
        check = ck.Budget(limits)
    elif inv.matches_reference is not None:
        check = _reference_check(doc, inv.matches_reference, here, task_attribute)
    else:
        assert inv.expr is not None
        check = ck.Expr(expression(inv.expr, here, GUARD_VARIABLES))
    return CompiledInvariant(policy, inv, kind, check, guard)


def _reference_check(
    doc: LocatedYaml, spec: sc.MatchesReference, here: tuple[str | int, ...], task_attribute: str | None
) -> MatchesReference:
    source = spec.reference
    if source.context is not None:
        reference = context_reference(source.context)
    else:
        assert source.file is not None
        loc = (*here, "reference", "file")
        attribute = source.key or task_attribute
        if attribute is None:
            raise doc.error(loc, "a reference file needs reference.key or task.attribute to pick a trajectory's entry")
        data = _read_policy_file(doc, source.file, spec.allow_outside_policy_dir, loc, "reference file")
        if not isinstance(data, dict):
            raise doc.error(loc, f"reference file {source.file!r} must map each task id to a list of tool calls")
        references = {}
        for task, value in data.items():
            try:
                references[str(task)] = reference_calls(value)
            except ValueError as exc:
                raise doc.error(loc, f"reference file {source.file!r}, entry {task!r}: {exc}") from None
        reference = file_reference(references, attribute)
    return MatchesReference(reference, spec.mode, spec.args, spec.per_tool)


def _read_policy_file(doc: LocatedYaml, name: str, allow_outside: bool, loc: tuple[str | int, ...], what: str) -> Any:
    """A YAML or JSON file a policy names, relative to the policy; outside the policy's folder
    (after symlinks) only when ``allow_outside``."""
    folder = os.path.realpath(os.path.dirname(os.path.abspath(doc.path)))
    full = os.path.realpath(os.path.join(folder, name))
    if not allow_outside and os.path.commonpath([folder, full]) != folder:
        raise doc.error(
            loc,
            f"{what} {name!r} is {full}, outside the policy's folder {folder}: move it beside the policy, or set "
            "allow_outside_policy_dir: true if this is meant",
        )
    try:
        return yamlfile.load(full).data  # YAML is a superset of JSON: reads both
    except yamlfile.YamlError as exc:
        if exc.message.startswith("cannot read: "):
            raise doc.error(loc, f"{what} {name!r} cannot be read: {exc.message[13:]}") from None
        where = f" line {exc.line}" if exc.line is not None else ""
        raise doc.error(loc, f"{what} {name!r}{where}: {exc.message}") from None


def _expected_source(
    a: sc.ArgEquals, path: Callable[[str, str], tuple[str | int, ...]]
) -> Callable[[ck.Run, Step], tuple[Any, str | None]]:
    """Where ``arg_equals`` takes its expected value from: returns (value, why it is unknown)."""
    if a.context is not None:
        key = a.context
        ctx_path = path(key, "context")

        def from_context(run: ck.Run, step: Step) -> tuple[Any, str | None]:
            value = run.ctx.get(key, MISSING)
            if value is MISSING:
                value = lookup(run.ctx, ctx_path)
            return (None, f"no ground truth {key!r} in the context") if value is MISSING else (value, None)

        return from_context
    if a.step is not None:
        source = _tools(a.step.tool)
        use_result = a.step.result is not None
        field = a.step.result if a.step.result is not None else a.step.arg
        assert field is not None
        src_path = path(field, "step")
        what = "result" if use_result else "argument"

        def from_step(run: ck.Run, step: Step) -> tuple[Any, str | None]:
            unordered = run.call_in_unknown_order(source, step)
            if unordered is not None:
                return None, (f"{run.where(unordered)} ({unordered.name}) and {run.where(step)} were timed by "
                              "different clocks, which cannot say which started first")  # fmt: skip
            src = run.last_call_before(source, step.index)
            if src is None:
                return None, f"no successful {ck.tools_text(source)} before {run.where(step)}"
            if src.unsure:  # if it failed, an earlier call holds the value
                return None, ck.unsure_text(run, src)
            status = src.result_status if use_result else src.args_status
            if status != "captured":
                return None, f"{what} of {run.where(src)} ({src.name}) is {status}"
            value = lookup(src.result if use_result else src.args, src_path)
            if value is MISSING:
                return None, f"{what} of {run.where(src)} ({src.name}) has no {field}"
            return value, None

        return from_step
    constant = a.value
    return lambda run, step: (constant, None)


def _read_context_file(doc: LocatedYaml, spec: sc.PolicyFile) -> dict[str, dict[str, Any]]:
    assert spec.context is not None and spec.context.file is not None
    loc = ("context", "file")
    if spec.task is None:
        raise doc.error(loc, "context.file needs task.attribute to know which entry belongs to a trajectory")
    data = _read_policy_file(doc, spec.context.file, spec.context.allow_outside_policy_dir, loc, "context file")
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise doc.error(loc, f"context file {spec.context.file!r} must map each task id to a mapping of values")
    return {str(k): {str(kk): vv for kk, vv in v.items()} for k, v in data.items()}
