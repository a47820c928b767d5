#!/usr/bin/env bash
# Checks that the crate builds with no optional feature and with each feature alone:
# a feature per optional dependency means any one of them, without the others, compiles.
#
#   scripts/features.sh
#
# The CI's all-features build cannot see a module gated on one feature that uses an item
# gated on another; this can.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The names of the [features] table of the crate's manifest, `default` left out.
features=$(awk '
    /^\[features\]/ { on = 1; next }
    /^\[/ { on = 0 }
    on && /^[a-z0-9_-]+ *=/ { sub(/ *=.*/, ""); if ($0 != "default") print }
' Cargo.toml)

# check ARGS...: cargo check, failing on a warning as on an error.
check() {
    local out
    out=$(cargo check --quiet -p tower-idempotency --no-default-features "$@" 2>&1) || {
        echo "$out"
        return 1
    }
    if [[ -n "$out" ]]; then
        echo "$out"
        echo "warnings with: --no-default-features $*"
        return 1
    fi
}

echo "no optional feature"
check
for feature in $features; do
    echo "feature ${feature} alone"
    check --features "${feature}"
done
