#!/usr/bin/env python3
"""Adds up the quiet time and false alerts of several fleet evaluations
(bench/fleet/evaluate.py --out FILE) run with the same rules and agent build.

The bar of at most one false alert per quiet fleet-day needs more quiet time than
one run gives; runs with the same rules (the rules file's SHA-256) and the same
agent revision measure the same thing, so their quiet fleet-hours and false alerts
add up. Runs that differ are refused, naming what differs.

Usage: bench/fleet/quiet_total.py RESULT.json...
"""

import json
import sys


def total(summaries):
    """The summed quiet time and false alerts of runs that match (pure)."""
    if not summaries:
        raise ValueError("no runs given")
    first = summaries[0]
    for key in ("rules_sha256", "vtax_revisions"):
        values = {json.dumps(s.get(key)) for s in summaries}
        if len(values) > 1:
            raise ValueError(f"the runs differ in {key}: {', '.join(sorted(values))}")
        if first.get(key) is None:
            raise ValueError(f"a run does not say its {key}")
    hours = sum(s["quiet_fleet_hours"] for s in summaries)
    false = sum(s["false_episodes_in_quiet_time"] for s in summaries)
    return {
        "runs": len(summaries),
        "quiet_fleet_hours": hours,
        "quiet_fleet_days": hours / 24.0,
        "false_episodes_in_quiet_time": false,
        "false_alerts_per_quiet_fleet_day": false / (hours / 24.0) if hours else None,
        "rules_sha256": first["rules_sha256"],
        "vtax_revisions": first["vtax_revisions"],
    }


def main(paths):
    if not paths:
        raise SystemExit(__doc__.strip().splitlines()[-1])
    summaries = []
    for path in paths:
        with open(path) as f:
            summaries.append(json.load(f)["summary"])
    try:
        print(json.dumps(total(summaries), indent=2))
    except ValueError as e:
        raise SystemExit(f"quiet_total: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
