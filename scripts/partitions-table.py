#!/usr/bin/env python3
"""The tables of docs/partitions.md ("Results"), computed from every seed kept in
conformance/results/partitions/<configuration>.txt (see the README there).

    python3 scripts/partitions-table.py                 # every configuration, every seed kept
    python3 scripts/partitions-table.py --since 39fb6e2  # only seeds of binaries built at or after
                                                         # a commit (its ancestors are left out)
    python3 scripts/partitions-table.py --before 39fb6e2 # only seeds of binaries built before it
    python3 scripts/partitions-table.py redis postgres  # these configurations only
    python3 scripts/partitions-table.py --write-docs    # rewrites the tables in docs/partitions.md

A seed counts once its SEED line is written (its faults' RESULT lines come before it). A seed
whose test failed without an anomaly (exit 101, every anomaly count 0: the harness or a member
gave up, see the kept log) is listed apart and its faults are left out of the columns.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

RESULTS = os.path.join(os.path.dirname(__file__), "..", "conformance", "results", "partitions")

# name: (heading, TTL ms, the environment and test that replay it)
CONFIGS = {
    "etcd-cluster": ("etcd, 3 members", 2000, "", "partitions_etcd_cluster"),
    "etcd-cluster-prevote": (
        "etcd, 3 members with `--pre-vote`",
        2000,
        "HEADCOUNT_PARTITIONS_PRE_VOTE=1 ",
        "partitions_etcd_cluster",
    ),
    "postgres": ("PostgreSQL", 1000, "", "partitions_postgres"),
    "redis": ("Redis, one server", 1000, "", "partitions_redis"),
    "redis-cluster": ("Redis Cluster, 3 primaries", 1000, "", "partitions_redis_cluster"),
    "redis-sentinel-wait": ("Redis Sentinel, `wait_replicas=1`", 1000, "", "partitions_redis_sentinel"),
    "redis-sentinel-nowait": (
        "Redis Sentinel without `wait_replicas`",
        1000,
        "HEADCOUNT_PARTITIONS_WAIT=0 ",
        "partitions_redis_sentinel",
    ),
    "redis-sentinel-nowait-failovers": (
        "Redis Sentinel without `wait_replicas`, failovers only",
        1000,
        "HEADCOUNT_PARTITIONS_WAIT=0 HEADCOUNT_PARTITIONS_FAULTS=PrimaryIsolated ",
        "partitions_redis_sentinel",
    ),
}

ANOMALY_KINDS = ["two_members", "stale_grant", "fence_order", "lost_ack", "duplicate", "unprocessed", "past_lease"]

FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def fields(line):
    return {k: v for k, v in FIELD.findall(line)}


def at_or_after(commit, since):
    """Whether binaries built from `commit` (a short hash, `+` when the tree had changes) are at
    or after `since`."""
    commit = commit.rstrip("+")
    return subprocess.run(
        ["git", "merge-base", "--is-ancestor", since, commit],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ).returncode == 0


def included(commit, since, before=None):
    """Whether the seeds of binaries built from `commit` are kept: at or after `since` (when
    given) and not at or after `before` (when given)."""
    if since is not None and not at_or_after(commit, since):
        return False
    return before is None or not at_or_after(commit, before)


def read(name, since, before=None):
    """The seeds of one configuration: [(seed line fields, [result line fields])]."""
    path = os.path.join(RESULTS, name + ".txt")
    if not os.path.exists(path):
        return []
    seeds, pending = [], {}
    with open(path) as f:
        for line in f:
            if line.startswith("RESULT "):
                r = fields(line)
                pending.setdefault(r["seed"], []).append(r)
            elif line.startswith("SEED "):
                s = fields(line)
                results = pending.pop(s["seed"], [])
                if included(s["commit"], since, before):
                    seeds.append((s, results))
    return seeds


def ms(v):
    return None if v in ("-", "never") else int(v)


def spread(values):
    """"median / largest" of the values that are numbers, "-" when none."""
    nums = [v for v in values if v is not None]
    if not nums:
        return "-"
    return f"{int(statistics.median_low(nums)):,} / {max(nums):,}"


def table(name, since, suffix="", before=None):
    heading, ttl, env, test = CONFIGS[name]
    heading += suffix
    seeds = read(name, since, before)
    if not seeds:
        return ""
    goal = ttl + 2 * ttl // 3
    anomalous, failed, counted = [], [], []
    for s, results in seeds:
        count = sum(int(s.get(k, 0)) for k in ANOMALY_KINDS)
        if count:
            anomalous.append((s["seed"], count))
            counted.append((s, results, True))
        elif s["exit"] != "0":
            failed.append(s["seed"])
        else:
            counted.append((s, results, False))
    faults = sum(len(r) for _, r, _ in counted)
    # In the order they first ran.
    commits = list(dict.fromkeys(s["commit"] for s, _ in sorted(seeds, key=lambda x: x[0]["at"])))
    first = min(s["at"] for s, _ in seeds)
    last = max(s["at"] for s, _ in seeds)
    out = [f"### {heading}", ""]
    out.append(
        f"{len(counted)} seed{'s' if len(counted) != 1 else ''} ({faults} faults), TTL {ttl // 1000} s (one TTL plus two heartbeats: "
        f"{goal} ms), binaries of {', '.join(commits)}, {first} to {last}; seeds with anomalies: "
        f"{len(anomalous)}"
        + (" (" + ", ".join(f"{seed}: {n}" for seed, n in anomalous) + ")" if anomalous else "")
        + "."
    )
    if failed:
        out.append(
            f"Left out: {len(failed)} seed(s) whose test failed without an anomaly ("
            + ", ".join(failed)
            + ")."
        )
    out += [
        "",
        f"`{env}HEADCOUNT_PARTITIONS_RUNS={len(counted)} cargo test --release -p headcount-conformance "
        f"--all-features --test partitions {test} -- --exact --nocapture`",
        "",
        "| fault | played | in seeds with anomalies | struck side, longest gap (ms) | others, longest gap (ms) "
        "| after the heal, longest gap (ms) | all active under one view after (ms) "
        "| over one TTL + two heartbeats | keys moved | cut member granted for (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    kinds = {}
    for _, results, bad in counted:
        for r in results:
            kinds.setdefault(r["kind"], []).append((r, bad))
    for kind in sorted(kinds):
        rows = kinds[kind]
        col = lambda k: [ms(r[k]) for r, _ in rows]
        converged = col("converged_after_heal_ms")
        over = sum(1 for c in converged if c is None or c > goal)
        out.append(
            f"| `{kind}` | {len(rows)} | {sum(1 for _, b in rows if b)} | {spread(col('gap_struck_side_ms'))} "
            f"| {spread(col('gap_other_side_ms'))} | {spread(col('gap_after_heal_ms'))} "
            f"| {spread(converged)} | {over} | {spread(col('keys_moved'))} "
            f"| {spread(col('granted_after_cut_ms'))} |"
        )
    return "\n".join(out) + "\n"


DOCS = os.path.join(os.path.dirname(__file__), "..", "docs", "partitions.md")
BEGIN = "<!-- tables: python3 scripts/partitions-table.py --write-docs -->"
END = "<!-- end of the tables -->"

# Configurations shown again with only the seeds of binaries at or after a commit: a fix that
# changed what the columns measure.
SINCE = [("etcd-cluster", "39fb6e2", ", since the pinned endpoint (39fb6e2)")]


def write_docs():
    """Replaces what stands between BEGIN and END in docs/partitions.md."""
    text = open(DOCS).read()
    try:
        head, rest = text.split(BEGIN + "\n", 1)
        _, tail = rest.split(END, 1)
    except ValueError:
        sys.exit(f"docs/partitions.md lacks the markers {BEGIN!r} and {END!r}")
    tables = [table(n, None) for n in CONFIGS]
    for name, since, suffix in SINCE:
        tables.insert(list(CONFIGS).index(name) + 1, table(name, since, suffix))
    body = "\n".join(t for t in tables if t)
    open(DOCS, "w").write(head + BEGIN + "\n\n" + body + "\n" + END + tail)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="*", help="configurations (default: all)")
    parser.add_argument("--since", help="only seeds of binaries built at or after this commit")
    parser.add_argument("--before", help="only seeds of binaries built before this commit")
    parser.add_argument("--write-docs", action="store_true", help="rewrite the tables in docs/partitions.md")
    args = parser.parse_args()
    if args.write_docs:
        write_docs()
        return
    names = args.configs or list(CONFIGS)
    for n in names:
        if n not in CONFIGS:
            sys.exit(f"unknown configuration {n!r}: one of {', '.join(CONFIGS)}")
    print("\n".join(t for t in (table(n, args.since, "", args.before) for n in names) if t))


if __name__ == "__main__":
    main()
