"""Live consistency: per policy and task group, the modal tool path over a sliding window of
recent trajectories, the share on it (``plumb_path_agreement``) and how often the modal path
changed (``plumb_path_changes_total``). A prompt or model change that alters behaviour shows
up here before a violation does.

The path of a trajectory is the names of its successful tool calls in order. Incomplete
trajectories are left out (a cut-short path is not a change of behaviour), as are those no
policy applied to. Memory is bounded: at most ``max_groups`` (policy, group) windows, each of
``window`` small integers and at most ``max_paths`` distinct paths (rarer ones are counted as
"another path", never modal). Each trajectory costs O(1), or O(max_paths) when the window lets
go of a trajectory on the modal path (the modal path is then looked for again).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from otel_plumb.model import Decided
from otel_plumb.stats import rate

OTHER = -1


class ConsistencyConfig(BaseModel):
    """The processor config's ``consistency`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # A task group is the agent, or the value of a trajectory attribute (an intent label).
    group_by: Literal["agent", "attribute"] = "agent"
    attribute: str | None = None
    # Trajectories per window.
    window: int = Field(default=200, ge=5)
    # The modal path changes only once the window holds this many trajectories.
    min_trajectories: int = Field(default=20, ge=1)
    max_paths: int = Field(default=50, ge=2)
    max_groups: int = Field(default=1000, ge=1)


@dataclass(slots=True)
class Agreement:
    """What one decision changed, for the metrics."""

    policy: str
    group: str
    share: float
    trajectories: int
    changed: bool


def tool_path(decided: Decided) -> tuple[str, ...] | None:
    """The successful tool calls of a final, complete, checked trajectory, in order; None for
    the others (a cut-short path is no evidence, an unchecked one has no policy to count under)."""
    t = decided.trajectory
    if decided.decision != "final" or not decided.policies or not t.complete:
        return None
    return tuple(s.name for s in t.steps if s.kind == "tool" and s.succeeded)


def task_group(decided: Decided, config: ConsistencyConfig) -> str:
    """The task group of a trajectory: its agent (or service), or an attribute's value."""
    t = decided.trajectory
    if config.group_by == "attribute" and config.attribute:
        value = t.attributes.get(config.attribute)
        return "" if value is None else str(value)
    return t.agent or t.service or ""


class _Window:
    __slots__ = ("counts", "ids", "modal", "next_id", "paths", "recent")

    def __init__(self, size: int) -> None:
        self.recent: deque[int] = deque(maxlen=size)
        self.paths: dict[tuple[str, ...], int] = {}
        self.ids: dict[int, tuple[str, ...]] = {}
        self.counts: dict[int, int] = {}
        self.modal: int | None = None
        self.next_id = 0


class PathAgreement:
    def __init__(self, config: ConsistencyConfig) -> None:
        self.config = config
        self._windows: dict[tuple[str, str], _Window] = {}

    def add(self, decided: Decided) -> Iterator[Agreement]:
        """Count one final decision; one ``Agreement`` per policy that applied."""
        path = tool_path(decided)
        if path is None:
            return
        group = task_group(decided, self.config)
        for policy in dict.fromkeys(decided.policies):
            window = self._window(policy, group)
            if window is not None:
                yield self._add(window, policy, group, path)

    def _window(self, policy: str, group: str) -> _Window | None:
        key = (policy, group)
        window = self._windows.get(key)
        if window is None:
            if len(self._windows) >= self.config.max_groups:
                return None
            window = self._windows[key] = _Window(self.config.window)
        return window

    def _add(self, w: _Window, policy: str, group: str, path: tuple[str, ...]) -> Agreement:
        before = w.modal
        modal_dropped = False
        if len(w.recent) == w.recent.maxlen:  # the oldest leaves first, so its slot can be reused
            old = w.recent.popleft()
            w.counts[old] -= 1
            modal_dropped = old == w.modal
            if not w.counts[old]:
                del w.counts[old]
                self._forget(w, old)
        path_id = w.paths.get(path)
        if path_id is None:
            if len(w.paths) < self.config.max_paths:
                path_id = w.paths[path] = w.next_id
                w.ids[path_id] = path
                w.next_id += 1
            else:
                path_id = OTHER
        w.recent.append(path_id)
        w.counts[path_id] = w.counts.get(path_id, 0) + 1
        if modal_dropped or w.modal is None:
            # The modal path lost a trajectory: look again (at most max_paths counts), keeping it on a tie.
            best = max((c for p, c in w.counts.items() if p != OTHER), default=0)
            if w.modal is None or w.counts.get(w.modal, 0) < best:
                w.modal = next((p for p, c in w.counts.items() if p != OTHER and c == best), None)
        elif path_id != OTHER and w.counts[path_id] > w.counts.get(w.modal, 0):
            w.modal = path_id
        changed = before is not None and w.modal != before and len(w.recent) >= self.config.min_trajectories
        modal_count = w.counts.get(w.modal, 0) if w.modal is not None else 0
        return Agreement(policy, group, modal_count / len(w.recent), len(w.recent), changed)

    @staticmethod
    def _forget(w: _Window, path_id: int) -> None:
        """A path no longer in the window frees its slot among the max_paths (its id is not reused)."""
        if path_id == OTHER:
            return
        path = w.ids.pop(path_id)
        w.paths.pop(path, None)


def path_agreement(decided: Iterable[Decided], config: ConsistencyConfig | None = None) -> list[dict[str, Any]]:
    """Offline (replay): per policy and group, the share of all the given trajectories on the
    modal tool path, with its Wilson 95% bounds and the modal path itself."""
    config = config or ConsistencyConfig()
    paths: dict[tuple[str, str], Counter[tuple[str, ...]]] = {}
    for d in decided:
        path = tool_path(d)
        if path is None:
            continue
        group = task_group(d, config)
        for policy in dict.fromkeys(d.policies):
            paths.setdefault((policy, group), Counter())[path] += 1
    out = []
    for (policy, group), counts in sorted(paths.items()):
        modal, held = counts.most_common(1)[0]
        n = sum(counts.values())
        out.append({"policy": policy, "group": group, "modal_path": list(modal), "paths": len(counts),
                    **rate(held, n).as_dict()})  # fmt: skip
    return out
