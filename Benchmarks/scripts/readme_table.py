#!/usr/bin/env python3
"""Prints the README's Performance tables (Markdown) from a benchmark JSON report.

Usage: python3 Benchmarks/scripts/readme_table.py results.json
Each latency peer gets p50 / p99 in µs and its p50 ratio to the scenario's floor (floor-epoll,
or floor-timerfd for the timer scenario, or the Foundation peer for main-rtt); figures get their
value and unit. Then the issue's targets as the run checked them. Nothing is typed by hand:
paste the output as it is.
"""
import json
import sys

FLOORS = {"timer-1ms-lateness": "floor-timerfd", "main-rtt": "mainactor-foundation-runloop"}


def main(path):
    report = json.load(open(path))
    print(f"Mode `{report['mode']}`, `--pin {report['pin']}`, {report['cpus']} CPUs, "
          f"load average {report['load_avg_1m']['start']} → {report['load_avg_1m']['end']}.\n")
    print("| scenario | peer | p50 | p99 | p50 ÷ reference |")
    print("|---|---|---:|---:|---:|")
    for scenario, peers in report["scenarios"].items():
        reference = FLOORS.get(scenario, "floor-epoll")
        base = peers.get(reference, {}).get("p50")
        for peer, stats in peers.items():
            if stats.get("unit") == "us":
                ratio = f"{stats['p50'] / base:.2f}×" if base else ""
                if peer == reference:
                    ratio = "reference"
                print(f"| {scenario} | {peer} | {stats['p50']:.2f} µs | {stats['p99']:.2f} µs | {ratio} |")
            else:
                extras = ", ".join(f"{k} {v:g}" for k, v in stats.items() if k not in ("unit", "value") and v is not None)
                value = f"{stats['value']:,.0f} {stats['unit']}"
                print(f"| {scenario} | {peer} | {value} | | {extras} |")
    targets = report.get("targets", [])
    if targets:
        print("\nTargets, as this run checked them:\n")
        print("| target | measured | bound | |")
        print("|---|---:|---|---|")
        for target in targets:
            value = target["value"]
            measured = "not measured" if value is None else f"{value:,.2f}"
            verdict = {True: "met", False: "**missed**", None: ""}[target["met"]]
            print(f"| {target['target']} | {measured} | {target['bound']} | {verdict} |")


if __name__ == "__main__":
    main(sys.argv[1])
