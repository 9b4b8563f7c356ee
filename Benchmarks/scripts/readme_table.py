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
the headline table (the README's: each path of each scenario the run measured); `--verify FILE` checks that FILE holds that table
exactly (CI runs it on the README). Nothing is typed by hand: paste the output as it is.
"""
import argparse
import json
import os
import sys

FLOORS = {"timer-1ms-lateness": "floor-timerfd", "main-rtt": "mainactor-foundation-runloop"}
# The headline: our peer on each path (issue 26) against its matched floor -- the floor whose two
# ends wait the way that path's loop does -- and the best other peer. Rows whose scenario or peer
# the run did not measure are left out; a matched floor the run did not measure is said so.
FUTEX = ("futex", "sources and jobs only", "floor-futex")
EPOLL = ("epoll", "a timer and a descriptor registered", "floor-epoll")
HEADLINE = [
    ("wake-rtt", "asyncrunloop", FUTEX, "a sleeping loop woken from another thread, round trip"),
    ("wake-rtt", "asyncrunloop-epoll", EPOLL, "a sleeping loop woken from another thread, round trip"),
    ("wake-rtt-b2b", "asyncrunloop", FUTEX, "the same, back-to-back (the loop may still be awake)"),
    ("wake-rtt-b2b", "asyncrunloop-epoll", EPOLL, "the same, back-to-back (the loop may still be awake)"),
    ("actor-rtt", "asyncrunloop", FUTEX, "a call into an actor pinned to a loop, from one on another, round trip"),
    ("actor-rtt", "asyncrunloop-epoll", EPOLL,
     "a call into an actor pinned to a loop, from one on another, round trip"),
    ("thread-actor-rtt", "asyncrunloop", FUTEX, "a plain thread calls an actor pinned to a sleeping loop, round trip"),
    ("thread-actor-rtt", "asyncrunloop-epoll", EPOLL,
     "a plain thread calls an actor pinned to a sleeping loop, round trip"),
    ("stream-rtt", "asyncrunloop", FUTEX, "an element through an async sequence to a task on a loop, round trip"),
    ("stream-rtt", "asyncrunloop-epoll", EPOLL,
     "an element through an async sequence to a task on a loop, round trip"),
    ("stream-rtt-b2b", "asyncrunloop", FUTEX, "the same, back-to-back"),
    ("stream-rtt-b2b", "asyncrunloop-epoll", EPOLL, "the same, back-to-back"),
    # A callback timer against the callback timers and sleeps of the peers (the timer sequence, a
    # task resumed per tick, is in the full tables, next to `Task.sleep`).
    ("timer-1ms-lateness", "asyncrunloop-looptimer", ("timer", "", "floor-timerfd"),
     "how late a 1 ms timer's callback runs"),
    ("main-rtt", "asyncrunloop", ("main", "", None), "a hop to the main thread and back"),
]


def reference_floor(scenario, peer, peers):
    """The floor a peer's p50 is divided by in the full tables: its path's matched floor."""
    if scenario in FLOORS:
        return FLOORS[scenario]
    if peer.endswith("-epoll") or "floor-futex" not in peers:
        return "floor-epoll"
    return "floor-futex"


def headline(report):
    rows = ["| scenario (p50) | path | AsyncRunLoop | matched floor | best peer | ÷ floor | ÷ best peer |",
            "|---|---|---:|---:|---|---:|---:|"]
    for scenario, peer, (path, path_meaning, floor_name), meaning in HEADLINE:
        peers = report["scenarios"].get(scenario)
        if not peers or peer not in peers:
            continue
        ours = peers[peer]["p50"]
        floor = peers[floor_name]["p50"] if floor_name in peers else None
        others = {name: stats["p50"] for name, stats in peers.items()
                  if not name.startswith(("asyncrunloop", "floor-")) and stats.get("unit") == "us"}
        best = min(others, key=others.get) if others else None
        if floor:
            floor_text = f"{floor:.2f} µs (`{floor_name}`)"
        elif floor_name:
            floor_text = f"not measured in this run (`{floor_name}`)"
        else:
            floor_text = "none measured"
        floor_ratio = f"{ours / floor:.2f}×" if floor else ""
        path_text = f"{path} ({path_meaning})" if path_meaning else ""
        best_text = f"{others[best]:.2f} µs (`{best}`)" if best else "none measured"
        best_ratio = f"{ours / others[best]:.2f}×" if best else ""
        rows.append(f"| `{scenario}`: {meaning} | {path_text} | {ours:.2f} µs (`{peer}`) | {floor_text} | "
                    f"{best_text} | {floor_ratio} | {best_ratio} |")
    return "\n".join(rows)


def full_tables(report):
    out = ["| scenario | peer | p50 | p99 | p50 ÷ reference |", "|---|---|---:|---:|---:|"]
    for scenario, peers in report["scenarios"].items():
        for peer, stats in peers.items():
            reference = reference_floor(scenario, peer, peers)
            base = peers.get(reference, {}).get("p50")
            if stats.get("unit") == "us":
                ratio = f"{stats['p50'] / base:.2f}× `{reference}`" if base else ""
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
        "\"Reference\" is the matched floor measured in the same run: two threads doing the same exchange "
        "and waiting the way the peer's loop does -- on a futex word (`floor-futex`, the futex path: "
        "`asyncrunloop`) or in `epoll_wait` + eventfd (`floor-epoll`, the epoll path: `asyncrunloop-epoll`, "
        "and every scenario of a run that had no `floor-futex`) -- a bare `timerfd` read for timers, and "
        "Foundation's `RunLoop.main` with `MainActor.run` for `main-rtt`.", "",
        full_tables(report), ""] + extras(args.json))
    output = args.output or os.path.splitext(args.json)[0] + ".md"
    open(output, "w", encoding="utf-8").write(text)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
