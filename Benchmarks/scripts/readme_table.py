#!/usr/bin/env python3
"""Writes the benchmark tables (Markdown) from a benchmark JSON report.

Usage: python3 Benchmarks/scripts/readme_table.py RESULTS.json [--measured-at TEXT] [--output OUT.md]
       python3 Benchmarks/scripts/readme_table.py RESULTS.json --headline
       python3 Benchmarks/scripts/readme_table.py RESULTS.json --verify README.md

The Markdown file (default: RESULTS.json with .md instead) holds the headline table, every
scenario and peer, and the targets as the run checked them. Each latency peer gets p50 / p99 in
µs and its p50 ratio to the scenario's floor (floor-epoll, or floor-timerfd for the timer
scenario, or the Foundation peer for main-rtt); figures get their value and unit. The JSON does
not record the commit it was measured at: pass it with --measured-at. `--headline` prints only
the five-row headline table (the README's); `--verify FILE` checks that FILE holds that table
exactly (CI runs it on the README). Nothing is typed by hand: paste the output as it is.
"""
import argparse
import json
import os
import sys

FLOORS = {"timer-1ms-lateness": "floor-timerfd", "main-rtt": "mainactor-foundation-runloop"}
# The headline: our peer in each latency scenario against its floor and the best other peer.
HEADLINE = [
    ("wake-rtt", "a sleeping loop woken from another thread, round trip"),
    ("actor-rtt", "a call into an actor pinned to a loop, round trip"),
    ("stream-rtt", "an element through an async sequence to a task on a loop, round trip"),
    ("timer-1ms-lateness", "how late a 1 ms timer fires"),
    ("main-rtt", "a hop to the main thread and back"),
]
MATCHED_FLOORS = {"wake-rtt": "floor-epoll", "actor-rtt": "floor-epoll", "stream-rtt": "floor-epoll",
                  "timer-1ms-lateness": "floor-timerfd"}


def headline(report):
    rows = ["| scenario (p50) | AsyncRunLoop | matched floor | best peer | ÷ floor | ÷ best peer |",
            "|---|---:|---:|---|---:|---:|"]
    for scenario, meaning in HEADLINE:
        peers = report["scenarios"][scenario]
        ours = peers["asyncrunloop"]["p50"]
        floor_name = MATCHED_FLOORS.get(scenario)
        floor = peers[floor_name]["p50"] if floor_name else None
        others = {name: stats["p50"] for name, stats in peers.items()
                  if not name.startswith(("asyncrunloop", "floor-")) and stats.get("unit") == "us"}
        best = min(others, key=others.get)
        floor_text = f"{floor:.2f} µs (`{floor_name}`)" if floor else "none measured"
        floor_ratio = f"{ours / floor:.2f}×" if floor else ""
        rows.append(f"| `{scenario}`: {meaning} | {ours:.2f} µs | {floor_text} | "
                    f"{others[best]:.2f} µs (`{best}`) | {floor_ratio} | {ours / others[best]:.2f}× |")
    return "\n".join(rows)


def full_tables(report):
    out = ["| scenario | peer | p50 | p99 | p50 ÷ reference |", "|---|---|---:|---:|---:|"]
    for scenario, peers in report["scenarios"].items():
        reference = FLOORS.get(scenario, "floor-epoll")
        base = peers.get(reference, {}).get("p50")
        for peer, stats in peers.items():
            if stats.get("unit") == "us":
                ratio = f"{stats['p50'] / base:.2f}×" if base else ""
                if peer == reference:
                    ratio = "reference"
                out.append(f"| {scenario} | {peer} | {stats['p50']:.2f} µs | {stats['p99']:.2f} µs | {ratio} |")
            else:
                extras = ", ".join(f"{k} {v:g}" for k, v in stats.items()
                                   if k not in ("unit", "value") and v is not None)
                value = f"{stats['value']:,.0f} {stats['unit']}"
                out.append(f"| {scenario} | {peer} | {value} | | {extras} |")
    targets = report.get("targets", [])
    if targets:
        met = sum(1 for t in targets if t["met"] is True)
        missed = sum(1 for t in targets if t["met"] is False)
        out += ["", f"## Targets, as this run checked them ({met} met, {missed} missed)", "",
                "| target | measured | bound | |", "|---|---:|---|---|"]
        for target in targets:
            value = target["value"]
            measured = "not measured" if value is None else f"{value:,.2f}"
            verdict = {True: "met", False: "**missed**", None: ""}[target["met"]]
            out.append(f"| {target['target']} | {measured} | {target['bound']} | {verdict} |")
    return "\n".join(out)


def extras(json_path):
    """Links to the run's latency plot and hand-written notes, when they sit next to the JSON."""
    stem = os.path.splitext(json_path)[0]
    lines = []
    if os.path.exists(stem + ".svg"):
        lines += [f"![Latency CDFs, all peers of a scenario on one chart]({os.path.basename(stem)}.svg)", ""]
    if os.path.exists(stem + "-notes.md"):
        lines += [f"What the figures say: [{os.path.basename(stem)}-notes.md]({os.path.basename(stem)}-notes.md).", ""]
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("json")
    parser.add_argument("--measured-at", default="", help="the commit and date of the run")
    parser.add_argument("--output", help="the Markdown file to write")
    parser.add_argument("--headline", action="store_true", help="print only the headline table")
    parser.add_argument("--verify", metavar="FILE", help="check that FILE contains the headline table")
    args = parser.parse_args()
    report = json.load(open(args.json))
    if args.headline:
        print(headline(report))
        return
    if args.verify:
        if headline(report) not in open(args.verify, encoding="utf-8").read():
            sys.exit(f"{args.verify} does not hold the headline table of {args.json} as generated "
                     f"(python3 {sys.argv[0]} {args.json} --headline)")
        print(f"{args.verify} holds the headline table of {args.json}")
        return
    measured = f" Measured at {args.measured_at}." if args.measured_at else ""
    load = report["load_avg_1m"]
    text = "\n".join([
        f"# Benchmark results: `{os.path.basename(args.json)}`", "",
        f"Generated by `Benchmarks/scripts/readme_table.py` from `{os.path.basename(args.json)}`; do not edit.",
        f"Mode `{report['mode']}`, `--pin {report['pin']}`, {report['cpus']} CPUs, "
        f"load average {load['start']} → {load['end']}.{measured}", "",
        "## Headline", "", headline(report), "",
        "## Every scenario and peer", "",
        "\"Reference\" is the floor measured in the same run: two threads doing the same exchange "
        "through `epoll_wait` + eventfd (`floor-epoll`), a bare `timerfd` read for timers, and "
        "Foundation's `RunLoop.main` with `MainActor.run` for `main-rtt`.", "",
        full_tables(report), ""] + extras(args.json))
    output = args.output or os.path.splitext(args.json)[0] + ".md"
    open(output, "w", encoding="utf-8").write(text)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
