#!/usr/bin/env python3
"""The agent's call, measured in the test command: one short row per concurrency of
`sluice bench --mode agents` (one agent per connection, `Prefer: wait`, the pipeline and the
upstream in processes of their own), printed beside the figures last recorded in
docs/agent-bench-ci.json, so a slower agent's call shows in the next CI log.

Figures, never a pass or a fail: this VM drifts by a fifth from one hour to the next, so no
threshold here could tell a regression from the machine. Read the ratios across several CI logs,
and measure a suspected regression as docs/performance-history.md does (release builds,
alternated). The test command runs the debug build it has just made; its figures are compared
only with figures of the same build profile (the file keeps one entry per profile).

    scripts/bench-agents-ci.py [--bin PATH] [--effects N] [--concurrency 1,16,64,256]
                               [--record]   # store this run as the profile's last figures
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "docs" / "agent-bench-ci.json"
FIELDS = (
    ("effects_per_sec", "effects/s", "{:.0f}"),
    ("p50_ms", "p50 ms", "{:.2f}"),
    ("p99_ms", "p99 ms", "{:.2f}"),
    ("cpu_us_per_effect", "CPU µs/effect", "{:.0f}"),
    ("peak_rss_mib", "RSS MiB", "{:.0f}"),
)


def profile_of(binary: Path) -> str:
    # target/<profile>/sluice: the directory names the profile.
    return binary.resolve().parent.name


def git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(binary: Path, effects: int, concurrency: str) -> list:
    with tempfile.TemporaryDirectory(prefix="sluice-agent-bench-") as data:
        done = subprocess.run(
            [str(binary), "bench", "--mode", "agents", "--effects", str(effects),
             "--concurrency", concurrency, "--data-dir", data, "--json"],
            capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"sluice bench --mode agents exited {done.returncode}")
    return json.loads(done.stdout)


def show(value, fmt: str) -> str:
    return "?" if value is None else fmt.format(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_bin = Path(os.environ.get("SLUICE_BIN", ROOT / "target" / "debug" / "sluice"))
    parser.add_argument("--bin", type=Path, default=default_bin)
    parser.add_argument("--effects", type=int, default=1000)
    parser.add_argument("--concurrency", default="1,16,64,256")
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()

    profile = profile_of(args.bin)
    rows = run(args.bin, args.effects, args.concurrency)
    recorded = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    last = recorded.get(profile)
    last_rows = {row["concurrency"]: row for row in last["rows"]} if last else {}
    if last:
        print(f"agent bench ({profile} build, {args.effects} effects per row); beside it the "
              f"figures recorded on {last['date']} ({last['rev']}, {last['effects']} effects per "
              f"row), and this run's ratio to them")
    else:
        print(f"agent bench ({profile} build, {args.effects} effects per row); no figures of "
              f"this profile are recorded in {RECORD.relative_to(ROOT)} to compare with")
    for row in rows:
        before = last_rows.get(row["concurrency"])
        parts = []
        for key, label, fmt in FIELDS:
            now = row.get(key)
            text = f"{label} {show(now, fmt)}"
            if before and before.get(key) and now is not None:
                text += f" (was {show(before[key], fmt)}, x{now / before[key]:.2f})"
            parts.append(text)
        print(f"  C={row['concurrency']}: " + "; ".join(parts))
    if args.record:
        recorded[profile] = {
            "date": datetime.date.today().isoformat(),
            "rev": git_rev(),
            "effects": args.effects,
            "rows": rows,
        }
        RECORD.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
        print(f"recorded as the last {profile} figures in {RECORD.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
