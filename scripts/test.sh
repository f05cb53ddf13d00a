#!/usr/bin/env bash
# The README's test command: installs what is missing (scripts/setup.sh), then runs every test of
# every crate with every backend compiled in. Servers the tests need are started by the tests
# themselves; one that is not installed is skipped loudly, or fails the run under
# HEADCOUNT_REQUIRE_BACKENDS=all (CI). Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec cargo test --workspace --all-features "$@"
