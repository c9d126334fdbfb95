#!/usr/bin/env python3
"""The figures of a scripts/bench-rebalance.sh run, from what it kept in its directory.

    python3 scripts/bench-rebalance-report.py DIR [TITLE]

DIR holds `marks` (when the load started, the third dispatcher joined, dispatcher 1 was
restarted under its name, dispatcher 2 was replaced by one with a new name, the load ended; ms
since the epoch), `sent` (per submitted batch: first effect index, count, ms) and `events` (the
events topic as kafka-console-consumer printed it, with timestamps and headers).

Per phase — steady (10 s after the load started until 5 s before the join), join, restart,
replace (each from 5 s before its step, so that what was submitted just before a step counts
with it; the last until the load ended) — it prints the longest gap between consecutive CONFIRMED events (a stop of the
whole group shows here) and, for the effects *submitted* in the phase, the time from submission
to CONFIRMED: p50, p99 and the slowest (a stop of some partitions shows here), and how many
took longer than 2 s.
"""

import sys
from pathlib import Path

SLOW_MS = 2_000
LEAD_MS = 5_000


def main() -> None:
    out = Path(sys.argv[1])
    title = sys.argv[2] if len(sys.argv) > 2 else out.name
    marks = {}
    for line in (out / "marks").read_text().splitlines():
        name, ms = line.split()
        marks[name] = int(ms)
    sent = {}
    for line in (out / "sent").read_text().splitlines():
        first, count, at = map(int, line.split())
        for i in range(first, first + count):
            sent[i] = at
    confirmed = []  # (confirmed at, effect index)
    for line in (out / "events").read_text().splitlines():
        if not line.startswith("CreateTime:") or "ce_type:dev.sluice.effect.confirmed" not in line:
            continue
        at = int(line.split("\t", 1)[0].split(":", 1)[1])
        run = line.split("ce_subject:", 1)[1].split("/", 1)[0]
        confirmed.append((at, int(run.rsplit("-", 1)[1])))
    confirmed.sort()

    t0 = marks["load_start"]
    rel = lambda ms: (ms - t0) / 1000  # noqa: E731 - seconds since the load started
    print(f"{title}: {len(sent)} effects submitted, {len(confirmed)} CONFIRMED")
    print(
        f"  third dispatcher started at t={rel(marks['join']):.1f} s; dispatcher 1 stopped at "
        f"t={rel(marks['restart']):.1f} s and running again at t={rel(marks['restarted']):.1f} s; "
        f"dispatcher 2 stopped at t={rel(marks['replace']):.1f} s, a new one running at "
        f"t={rel(marks['replaced']):.1f} s"
    )
    # Each step's phase starts LEAD before it: an effect submitted just before a step is
    # delayed by it, not by the phase before.
    phases = [
        ("steady", t0 + 10_000, marks["join"] - LEAD_MS),
        ("join", marks["join"] - LEAD_MS, marks["restart"] - LEAD_MS),
        ("restart", marks["restart"] - LEAD_MS, marks["replace"] - LEAD_MS),
        ("replace", marks["replace"] - LEAD_MS, marks["load_end"]),
    ]
    for name, lo, hi in phases:
        times = [at for at, _ in confirmed if lo <= at < hi]
        gap = max(((b - a, a) for a, b in zip(times, times[1:])), default=None)
        waits = sorted(at - sent[i] for at, i in confirmed if i in sent and lo <= sent[i] < hi)
        line = f"  {name:8} [{rel(lo):5.1f}, {rel(hi):5.1f}) s: {len(times)} CONFIRMED"
        if gap:
            line += f", longest gap {gap[0]} ms (at t={rel(gap[1]):.1f} s)"
        if waits:
            slow = sum(1 for ms in waits if ms > SLOW_MS)
            line += (
                f"; submitted then: p50 {waits[len(waits) // 2]} ms, "
                f"p99 {waits[len(waits) * 99 // 100]} ms, slowest {waits[-1]} ms, "
                f"{slow} of {len(waits)} over {SLOW_MS // 1000} s"
            )
        print(line)


if __name__ == "__main__":
    main()
