#!/usr/bin/env bash
# The project's test command.
#
#   scripts/test.sh [EXTRA CARGO TEST ARGS...]
#
# 1. Makes sure the external programs the tests use are on PATH:
#      redis-server, redis-cli   (Debian: redis-server, redis-tools)
#      redis-sentinel            (Debian: redis-sentinel; the Sentinel failover tests)
#      protoc + well-known types (Debian: protobuf-compiler, libprotobuf-dev)
#      nats-server               (Debian: nats-server, 2.9; JetStream tests of the
#                                 message door; Debian installs it in /usr/sbin)
#      initdb, pg_ctl            (Debian: postgresql, which keeps them in
#                                 /usr/lib/postgresql/<version>/bin, off PATH;
#                                 the tests find them there, and run the server
#                                 as the `postgres` user the package creates
#                                 when they run as root)
#      python3 with aiosmtpd     (Debian: python3-aiosmtpd, the SMTP server of
#                                 the outbound mail tests)
#      mariadbd, mariadb-install-db, mariadb
#                                (Debian: mariadb-server, 10.11; the MySQL store's
#                                 tests; Debian installs mariadbd in /usr/sbin;
#                                 the tests run the server as the `mysql` user
#                                 the package creates when they run as root)
#    Missing ones are installed with apt-get when running as root; otherwise
#    the script stops and says what to install. Prints nothing when all is
#    already there.
# 2. Exports TOWER_IDEMPOTENCY_REQUIRE_SERVERS=1, so a test that cannot start
#    its Redis server fails instead of skipping.
# 3. Runs `cargo test --workspace --all-features "$@"`.
#
# Examples:
#   scripts/test.sh
#   scripts/test.sh --test store -- redis_store:: --nocapture
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

missing_pkgs=()

# need COMMAND PACKAGE: queue PACKAGE when COMMAND is not on PATH.
need() {
    if ! command -v "$1" >/dev/null 2>&1; then
        missing_pkgs+=("$2")
    fi
}

need redis-server redis-server
need redis-cli redis-tools
need redis-sentinel redis-sentinel
if ! command -v nats-server >/dev/null 2>&1 && [[ ! -x /usr/sbin/nats-server ]]; then
    missing_pkgs+=(nats-server)
fi
need protoc protobuf-compiler
# protoc looks for google/protobuf/*.proto (the well-known types) in
# <prefix>/include next to its own binary; Debian ships them in libprotobuf-dev.
protoc_path="$(readlink -f "$(command -v protoc 2>/dev/null || echo /usr/bin/protoc)")"
protoc_include="$(dirname "$(dirname "$protoc_path")")/include"
if [[ ! -f "$protoc_include/google/protobuf/empty.proto" ]]; then
    missing_pkgs+=(libprotobuf-dev)
fi
# PostgreSQL's server programs: on PATH, or where Debian keeps them.
have_postgres() {
    command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && return 0
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null 2>&1 &&
        compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null 2>&1
}
if ! have_postgres || { [[ "$(id -u)" -eq 0 ]] && ! id -u postgres >/dev/null 2>&1; }; then
    missing_pkgs+=(postgresql)
fi

# MariaDB's server programs and client (mariadbd may be in /usr/sbin, off PATH).
have_mariadb() {
    { command -v mariadbd >/dev/null 2>&1 || [[ -x /usr/sbin/mariadbd ]]; } &&
        command -v mariadb-install-db >/dev/null 2>&1 &&
        command -v mariadb >/dev/null 2>&1
}
if ! have_mariadb || { [[ "$(id -u)" -eq 0 ]] && ! id -u mysql >/dev/null 2>&1; }; then
    missing_pkgs+=(mariadb-server)
fi

# The SMTP server of the outbound mail tests (tests/support/smtp_server.py runs
# under the first python3 that can import aiosmtpd, Debian's /usr/bin/python3 first).
have_aiosmtpd() {
    /usr/bin/python3 -c 'import aiosmtpd' >/dev/null 2>&1 || python3 -c 'import aiosmtpd' >/dev/null 2>&1
}
if ! have_aiosmtpd; then
    missing_pkgs+=(python3-aiosmtpd)
fi

if ((${#missing_pkgs[@]} > 0)); then
    if [[ "$(id -u)" -ne 0 ]]; then
        echo "scripts/test.sh: missing test dependencies and not running as root." >&2
        echo "Install them first, e.g.:" >&2
        echo "    sudo apt-get update && sudo apt-get install -y ${missing_pkgs[*]}" >&2
        exit 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "scripts/test.sh: missing ${missing_pkgs[*]} and apt-get is not available; install them by hand." >&2
        exit 1
    fi

    echo "scripts/test.sh: installing ${missing_pkgs[*]} with apt-get" >&2
    log="$(mktemp)"
    created_policy=0
    cleanup() {
        if ((created_policy)); then rm -f /usr/sbin/policy-rc.d; fi
        rm -f "$log"
    }
    trap cleanup EXIT
    # Do not let the redis-server, postgresql, mariadb-server and nats-server packages start
    # system-wide daemons (on ports 6379, 5432, 3306 and 4222): the tests start their own
    # servers, each on a free port with a data directory and socket of its own.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        created_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get update -qq >"$log" 2>&1 ||
        ! apt-get install -y -qq --no-install-recommends "${missing_pkgs[@]}" >>"$log" 2>&1; then
        cat "$log" >&2
        echo "scripts/test.sh: apt-get failed to install ${missing_pkgs[*]}" >&2
        exit 1
    fi
    cleanup
    trap - EXIT
    hash -r
    for cmd in redis-server redis-cli protoc; do
        if ! command -v "$cmd" >/dev/null 2>&1; then
            echo "scripts/test.sh: $cmd is still not on PATH after installing ${missing_pkgs[*]}" >&2
            exit 1
        fi
    done
    if ! have_postgres; then
        echo "scripts/test.sh: initdb/pg_ctl are still not found after installing ${missing_pkgs[*]}" >&2
        exit 1
    fi
    if ! have_mariadb; then
        echo "scripts/test.sh: mariadbd/mariadb-install-db are still not found after installing ${missing_pkgs[*]}" >&2
        exit 1
    fi
    if ! have_aiosmtpd; then
        echo "scripts/test.sh: python3 cannot import aiosmtpd after installing ${missing_pkgs[*]}" >&2
        exit 1
    fi
fi

# prost-build / tonic-build read PROTOC before searching PATH.
PROTOC="${PROTOC:-$(command -v protoc)}"
export PROTOC
export TOWER_IDEMPOTENCY_REQUIRE_SERVERS=1

exec cargo test --workspace --all-features "$@"
