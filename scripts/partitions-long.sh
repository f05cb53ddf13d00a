#!/usr/bin/env bash
# The partition tests' long schedule over many seeds, every configuration in turn, one seed per
# test run, appending each seed's result lines to conformance/results/partitions/<config>.txt so
# that the table in docs/partitions.md can be rebuilt from them (scripts/partitions-table.py).
#
#   sudo bash scripts/partitions-long.sh            # until stopped, or until UNTIL=HH:MM
#   ROUNDS=10 sudo bash scripts/partitions-long.sh  # ten seeds of each configuration
#   ONLY=etcd-cluster,postgres sudo bash scripts/partitions-long.sh  # these configurations only
#
# It builds the release test binary and member binary once, then copies them aside, so builds of
# other work in the same target directory during a long run do not change what runs. A file
# named PAUSE in the results directory pauses it between seeds; STOP ends it. Two copies may run
# at once (LANE=1 and LANE=2: each starts at another configuration): every test run creates a
# network of its own.
set -euo pipefail
cd "$(dirname "$0")/.."

results=conformance/results/partitions
mkdir -p "$results"
work=${WORK:-target/partitions-long}
mkdir -p "$work/logs"
lane=${LANE:-1}

if [ -z "${TEST_BIN:-}" ]; then
    cargo test --release -p headcount-conformance --all-features --test partitions --no-run 2>"$work/build.log" \
        || { tail -20 "$work/build.log"; exit 1; }
    cargo build --release -p headcount-conformance --all-features --bin headcount-chaos-member 2>>"$work/build.log"
    built=$(grep -o 'target/release/deps/partitions-[0-9a-f]*' "$work/build.log" | tail -1)
    stamp=$(date +%s)
    TEST_BIN=$work/partitions-$stamp
    MEMBER_BIN=$work/headcount-chaos-member-$stamp
    cp "$built" "$TEST_BIN"
    cp target/release/headcount-chaos-member "$MEMBER_BIN"
fi
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!conformance/results' || echo +)

# name | test | environment
configs=(
    "etcd-cluster|partitions_etcd_cluster|"
    "etcd-cluster-prevote|partitions_etcd_cluster|HEADCOUNT_PARTITIONS_PRE_VOTE=1"
    "postgres|partitions_postgres|"
    "redis|partitions_redis|"
    "redis-cluster|partitions_redis_cluster|"
    "redis-sentinel-wait|partitions_redis_sentinel|"
    "redis-sentinel-nowait|partitions_redis_sentinel|HEADCOUNT_PARTITIONS_WAIT=0"
    "redis-sentinel-nowait-failovers|partitions_redis_sentinel|HEADCOUNT_PARTITIONS_WAIT=0 HEADCOUNT_PARTITIONS_FAULTS=PrimaryIsolated"
)

round=0
start=$(( (lane - 1) * 3 ))
while :; do
    round=$((round + 1))
    if [ -n "${ROUNDS:-}" ] && [ "$round" -gt "$ROUNDS" ]; then break; fi
    for i in "${!configs[@]}"; do
        IFS='|' read -r name test envs <<<"${configs[$(( (i + start) % ${#configs[@]} ))]}"
        if [ -n "${ONLY:-}" ] && [[ ",$ONLY," != *",$name,"* ]]; then continue; fi
        while [ -e "$results/PAUSE" ]; do sleep 5; done
        [ -e "$results/STOP" ] && exit 0
        if [ -n "${UNTIL:-}" ] && [ "$(date +%H:%M)" \> "$UNTIL" ]; then exit 0; fi
        log="$work/logs/$name-$(date +%Y%m%d-%H%M%S)-$lane.log"
        set +e
        env $envs HEADCOUNT_PARTITIONS_RUNS=1 HEADCOUNT_PARTITIONS_MEMBER_BIN="$MEMBER_BIN" \
            HEADCOUNT_REQUIRE_BACKENDS=all "$TEST_BIN" "$test" --exact --nocapture >"$log" 2>&1
        rc=$?
        set -e
        seed=$(grep -o 'seed [0-9]*' "$log" | head -1 | cut -d' ' -f2)
        count() { grep -c -- "$1" "$log" || true; }
        summary="SEED config=$name seed=${seed:-none} exit=$rc commit=$commit at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        summary+=" two_members=$(count 'to two members:') stale_grant=$(count 'under older token')"
        summary+=" fence_order=$(count 'the sink accepted token') lost_ack=$(count 'were accepted; the sink holds')"
        summary+=" duplicate=$(count 'an id accepted') unprocessed=$(count 'never accepted')"
        summary+=" past_lease=$(count 'and its lease ran out by')"
        {
            flock 9
            grep '^RESULT ' "$log" >>"$results/$name.txt" || true
            echo "$summary" >>"$results/$name.txt"
        } 9>"$results/.lock"
        # Passing runs' logs are not kept; a failed run's log stays for its report.
        [ "$rc" = 0 ] && rm -f "$log"
    done
done
