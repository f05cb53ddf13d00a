#!/usr/bin/env bash
# Shows that a change (a refactoring) leaves the group's behaviour as it was: runs the group
# simulation's seeds on the commit given and on the work tree, and compares each seed's digest
# (its events, the faults each process drew, where every member ended; see
# core/tests/simulation.rs, HEADCOUNT_SIM_DIGESTS).
#
#   bash scripts/sim-digests.sh BASE_REF [SEEDS]     (default 4000 seeds)
#
# The base runs twice: seeds whose digests differ between its two runs do not replay exactly
# (a few with lossy notifications) and are left out. A stable seed whose digest differs on the
# work tree is run six times more there: it counts as changed only if none of those runs gives
# the base's digest. Prints the counts, and exits 1 when a seed changed.
set -euo pipefail
cd "$(dirname "$0")/.."
base_ref=${1:?usage: sim-digests.sh BASE_REF [SEEDS]}
seeds=${2:-4000}
# One target directory for both trees: the dependencies are built once.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
out=$(mktemp -d)
base_tree="$out/base"
git worktree add --detach "$base_tree" "$base_ref" >/dev/null
trap 'git worktree remove --force "$base_tree" >/dev/null 2>&1 || true; rm -rf "$out"' EXIT

run() { # DIR FILE [FIRST COUNT]
  (cd "$1" && HEADCOUNT_SIM_DIGESTS="$2" HEADCOUNT_SIM_FIRST_SEED="${3:-0}" \
    HEADCOUNT_SIM_SEEDS="${4:-$seeds}" cargo test -q --release -p headcount-core \
    --all-features --test simulation group_simulation >/dev/null 2>&1)
}

run "$base_tree" "$out/b1"
run "$base_tree" "$out/b2"
sort "$out/b1" > "$out/b1.s"
sort "$out/b2" > "$out/b2.s"
comm -12 "$out/b1.s" "$out/b2.s" > "$out/stable"
run . "$out/n"
sort "$out/n" > "$out/n.s"
comm -23 "$out/stable" "$out/n.s" > "$out/differ"

changed=0
while read -r seed digest _; do
  rm -f "$out/again"
  for _ in 1 2 3 4 5 6; do run . "$out/again" "$seed" 1; done
  if ! grep -q " $digest" "$out/again"; then
    echo "seed $seed: base $digest, now $(cut -d' ' -f2 "$out/again" | sort -u | tr '\n' ' ')"
    changed=$((changed + 1))
  fi
done < "$out/differ"

echo "seeds: $seeds; stable on the base: $(wc -l < "$out/stable"); differing once: $(wc -l < "$out/differ"); changed: $changed"
[ "$changed" -eq 0 ]
