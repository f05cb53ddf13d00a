#!/usr/bin/env bash
# Installs what headcount's tests need and the machine lacks: the servers the conformance suite
# starts (PostgreSQL, PgBouncer, Redis, etcd), Chromium and chromedriver for the group page's
# browser tests, and protoc with the protobuf well-known types (etcd-client compiles etcd's .proto
# files at build time). Idempotent: installs only what is missing.
# Uses apt-get when run as root on Debian/Ubuntu; otherwise it says what to install.
set -euo pipefail

have_postgres() {
    command -v initdb >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

missing=()
have_postgres || missing+=(postgresql)
# PgBouncer in transaction mode, in front of a PostgreSQL the tests start (Debian puts it in
# /usr/sbin, which is not on every user's PATH).
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
# A headless browser and its WebDriver for the group page's browser tests (cli/tests/page_browser.rs).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
[ -f /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
# The partition tests put members and servers in network namespaces (ip) and cut their links
# with nftables rules (nft).
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v nft >/dev/null 2>&1 || missing+=(nftables)

if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q
        apt-get install -y -q --no-install-recommends "${missing[@]}"
    else
        echo "setup: missing ${missing[*]}; install them (Debian/Ubuntu: sudo apt-get install ${missing[*]})" >&2
        # Without protoc the etcd backend cannot even compile; missing servers only skip their tests.
        if ! command -v protoc >/dev/null 2>&1 || [ ! -f /usr/include/google/protobuf/descriptor.proto ]; then
            exit 1
        fi
    fi
fi

# The Debian packages start servers of their own; the tests start theirs on free ports.
if command -v service >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    [ -d /etc/postgresql ] && { service postgresql stop >/dev/null 2>&1 || true; }
    [ -f /etc/pgbouncer/pgbouncer.ini ] && { service pgbouncer stop >/dev/null 2>&1 || true; }
    service redis-server stop >/dev/null 2>&1 || true
    service etcd stop >/dev/null 2>&1 || true
fi
