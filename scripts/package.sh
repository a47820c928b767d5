#!/usr/bin/env bash
# The workspace publishes, and its packages build their tests as published.
#
#   scripts/package.sh
#
# 1. `cargo publish --workspace --dry-run`: packages the macros, the crate and the client in
#    their order, and builds each from its package against the others' packages (needs
#    crates.io, for the index).
# 2. Unpacks each .crate and builds its tests and examples, with its sibling crates patched to
#    their packages (they are not on crates.io before the first release): a dev-dependency on
#    the crate must survive publishing, and a test must need nothing outside its package.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

cargo publish --workspace --dry-run --locked
# The .crate files as `cargo package` writes them (the dry run above verified them).
cargo package --workspace --exclude tower-idempotency-quickstart --no-verify --locked

# Where `cargo package` left the .crate files, and the version they carry.
read -r target version < <(cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, sys
meta = json.load(sys.stdin)
version = next(p["version"] for p in meta["packages"] if p["name"] == "tower-idempotency")
print(meta["target_directory"], version)')
# Each package is built from a copy outside the repository, where no workspace claims it, with
# the sibling packages it depends on patched in.
unpacked="$(mktemp -d)"
trap 'rm -rf "$unpacked"' EXIT
for name in tower-idempotency-macros tower-idempotency tower-idempotency-client; do
    tar -xzf "${target}/package/${name}-${version}.crate" -C "$unpacked"
done
patch() {
    for sibling in "$@"; do
        printf -- '--config\npatch.crates-io.%s.path="%s"\n' "$sibling" "${unpacked}/${sibling}-${version}"
    done
}
build() {
    local name="$1"
    shift
    echo "==> ${name} ${version}: the packaged tests build"
    local args=()
    mapfile -t args < <(patch "$@")
    (cd "${unpacked}/${name}-${version}" && cargo test --all-features --no-run "${args[@]}")
}
build tower-idempotency-macros
build tower-idempotency tower-idempotency-macros
build tower-idempotency-client tower-idempotency
