"""Mining throughput: ``python bench/suggest.py [--spans N] [--trajectories N]``.

Two measurements in one run:

- on a trace file (bench/replay.py's agent traces, 10-20 spans each): replaying it without a
  policy (read, normalise, assemble: what ``otel-plumb replay`` does before checking) against
  replaying it and mining every trajectory (what ``otel-plumb suggest`` does), as trajectories/s
  and their ratio;
- mining alone on ``--trajectories`` generated trajectories of 20 steps (10 model calls, 10 tool
  calls of 8 tools with arguments and results, invariants and a few faults planted, and a
  branch: when the stock check answers ``backorder``, one order in five, the agent notifies
  instead of reserving and charging), built as ``Trajectory`` objects so only the miner is
  timed, branch tables included.

Times are CPU time of this process (``time.process_time``), so a busy machine does not move them.
Target: 100k trajectories of 20 steps mined in under a minute on one core.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay import write_file

from otel_plumb.model import Step, Trajectory
from otel_plumb.replay import ReplayStats, iter_trajectories
from otel_plumb.suggest import Miner, Options

TOOLS = ("search", "fetch_order", "check_stock", "quote", "reserve", "charge", "notify", "log")
TARGET_SECONDS = 60.0


def generated(n: int, seed: int = 3) -> list[Trajectory]:
    """``n`` trajectories of 20 steps: model call, tool call, ... (the tool path varies a little,
    and by the stock check's answer)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        order = f"ORD-{rng.randrange(10**6):06d}"
        amount = round(rng.uniform(5, 900), 2)
        path = list(TOOLS)
        if rng.random() < 0.3:
            path[1], path[2] = path[2], path[1]
        stock = "backorder" if rng.random() < 0.2 else "in_stock"
        if stock == "backorder":
            path[path.index("reserve")], path[path.index("charge")] = "notify", "log"
        path += ["search", "log"]
        steps: list[Step] = []
        t0 = 1_700_000_000_000_000_000 + i * 10**9
        for k, tool in enumerate(path[:10]):
            steps.append(Step(2 * k, "llm", "chat", f"{i:08x}{2 * k:08x}", None, f"{i:032x}", t0, t0 + 10**6, "genai",
                              tokens=rng.randrange(100, 900)))  # fmt: skip
            fault = rng.random() < 0.01
            args = {"order_id": order, "amount": amount * (10 if fault and tool == "charge" else 1), "page": k}
            result = {"order_id": order, "total": amount, "status": stock if tool == "check_stock" else "ok"}
            steps.append(Step(2 * k + 1, "tool", tool, f"{i:08x}{2 * k + 1:08x}", None, f"{i:032x}", t0 + 10**6,
                              t0 + 2 * 10**6, "genai", args=args, args_status="captured", result=result,
                              result_status="captured"))  # fmt: skip
            t0 += 2 * 10**6
        out.append(Trajectory(f"{i:032x}", [f"{i:032x}"], steps, agent="shop"))
    return out


def mine_generated(n: int) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of this process, invariants proposed): on a shared machine the
    CPU time is what one core spent."""
    pool = generated(min(n, 5_000))
    miner = Miner(Options(min_support=0.95))
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        miner.add(pool[i % len(pool)])
    result = miner.finish()
    return time.perf_counter() - start, time.process_time() - cpu, sum(len(g.kept) for g in result.groups)


def replay_file(path: Path, mine: bool) -> tuple[float, int]:
    """(CPU seconds, trajectories) of replaying ``path``, and mining what it yields if ``mine``."""
    stats = ReplayStats()
    miner = Miner(Options()) if mine else None
    n = 0
    start = time.process_time()
    for t in iter_trajectories([path], stats):
        n += 1
        if miner is not None:
            miner.add(t)
    if miner is not None:
        miner.finish()
    return time.process_time() - start, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=200_000, help="spans in the trace file")
    parser.add_argument("--trajectories", type=int, default=100_000, help="generated trajectories to mine")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "traces.pb"
        write_file(path, args.spans)
        replay_s, n = replay_file(path, mine=False)
        both_s, _ = replay_file(path, mine=True)
    print(f"trace file: {args.spans} spans, {n} trajectories (CPU time: the machine may be shared)")
    print(f"  replay without a policy : {n / replay_s:10.0f} trajectories/s ({replay_s:.2f}s)")
    print(f"  replay + suggest        : {n / both_s:10.0f} trajectories/s ({both_s:.2f}s), "
          f"{replay_s / both_s:.2f}x replay's rate")  # fmt: skip
    print(f"  mining alone            : {n / max(both_s - replay_s, 1e-9):10.0f} trajectories/s")
    seconds, cpu, kept = mine_generated(args.trajectories)
    verdict = "ok" if cpu < TARGET_SECONDS else "OVER TARGET"
    print(f"generated: {args.trajectories} trajectories of 20 steps mined in {seconds:.1f}s wall, {cpu:.1f}s CPU "
          f"({args.trajectories / cpu:.0f}/s of CPU, {kept} invariants proposed; target < {TARGET_SECONDS:.0f}s: "
          f"{verdict})")  # fmt: skip


if __name__ == "__main__":
    main()
