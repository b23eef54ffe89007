#!/usr/bin/env bash
# A throw-away PostgreSQL server for the test suite (make test starts one, exports its URL, stops it afterwards).
#
#   scripts/test-postgres.sh start DIR   initdb a cluster in DIR (if not there yet), start it on a free port of
#                                        127.0.0.1 and write its SQLAlchemy URL to DIR/url
#   scripts/test-postgres.sh url DIR     print that URL: postgresql+psycopg://tessera@127.0.0.1:PORT/tessera
#   scripts/test-postgres.sh stop DIR    stop the server and remove DIR
#
# The server binaries come from /usr/lib/postgresql/*/bin (the newest version there), else from PATH, else the
# Debian package `postgresql` is installed with apt-get (through sudo when not root). PostgreSQL refuses to run as
# root, so as root the cluster belongs to the `postgres` system user (DIR must then be reachable by it: /tmp is).
# Authentication is `trust` for TCP on 127.0.0.1 only (and the unix socket, which lives in DIR); the role `tessera`
# is a superuser so tests can CREATE DATABASE. fsync is off: the data is thrown away.
# Every failure ends with one line "test-postgres.sh: error: ..." on stderr and a non-zero exit.
set -euo pipefail

PROG=test-postgres.sh
MARKER=.tessera-test-postgres # written in DIR first, so that `stop` only ever removes a directory this script made
ROLE=tessera
DB=tessera
LOG_TAIL=25

die() {
    echo "$PROG: error: $*" >&2
    exit 1
}

usage() {
    echo "usage: $PROG start DIR | stop DIR | url DIR" >&2
    exit 2
}

is_root() { [ "$(id -u)" -eq 0 ]; }

# --------------------------------------------------------------------------------------------- server binaries

find_bindir() {
    local dir best=""
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V); do
        if [ -x "$dir/pg_ctl" ] && [ -x "$dir/initdb" ] && [ -x "$dir/postgres" ]; then
            best=$dir
        fi
    done
    if [ -z "$best" ] && command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
        best=$(dirname "$(command -v pg_ctl)")
    fi
    [ -n "$best" ] && echo "$best"
}

install_postgres() {
    local -a apt
    if is_root; then
        apt=(env DEBIAN_FRONTEND=noninteractive apt-get)
    elif command -v sudo >/dev/null 2>&1; then
        # With no terminal to type a password into, sudo must not wait for one.
        if [ -t 0 ]; then apt=(sudo env DEBIAN_FRONTEND=noninteractive apt-get); else
            apt=(sudo -n env DEBIAN_FRONTEND=noninteractive apt-get); fi
    else
        die "PostgreSQL server binaries not found and cannot install them (not root, no sudo): install the Debian package 'postgresql', or run the tests with TESSERA_TEST_PG=skip"
    fi
    command -v apt-get >/dev/null 2>&1 ||
        die "PostgreSQL server binaries not found and apt-get is not available: install PostgreSQL (server) yourself, or run the tests with TESSERA_TEST_PG=skip"
    echo "$PROG: PostgreSQL server binaries not found; installing the Debian package postgresql" >&2
    local out
    out=$(mktemp /tmp/tessera-pg-apt.XXXXXX)
    if ! "${apt[@]}" install -y --no-install-recommends postgresql >"$out" 2>&1; then
        # A fresh machine often has no package lists yet.
        if ! { "${apt[@]}" update && "${apt[@]}" install -y --no-install-recommends postgresql; } >"$out" 2>&1; then
            tail -n "$LOG_TAIL" "$out" | sed 's/^/  | /' >&2
            rm -f "$out"
            die "apt-get install postgresql failed (output above); install it yourself, or run the tests with TESSERA_TEST_PG=skip"
        fi
    fi
    rm -f "$out"
}

# ------------------------------------------------------------------------------------- running as the owner

# Runs a command as the cluster's owner: the postgres system user when we are root, else ourselves.
as_owner() {
    if ! is_root; then
        "$@"
    elif command -v runuser >/dev/null 2>&1; then
        (cd / && runuser -u postgres -- "$@")
    else
        (cd / && su postgres -s /bin/sh -c 'exec "$0" "$@"' "$@")
    fi
}

# ---------------------------------------------------------------------------------------------- helpers

free_port() {
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
    else
        echo $((54329 + RANDOM % 2000))
    fi
}

show_log() {
    if [ -f "$1" ]; then
        tail -n "$LOG_TAIL" "$1" | sed 's/^/  | /' >&2
    fi
}

running() { [ -f "$DATA/postmaster.pid" ] && as_owner "$BINDIR/pg_ctl" status -D "$DATA" >/dev/null 2>&1; }

# ---------------------------------------------------------------------------------------------- commands

cmd_start() {
    BINDIR=$(find_bindir) || true
    if [ -z "$BINDIR" ]; then
        install_postgres
        BINDIR=$(find_bindir) || die "apt-get installed postgresql but no pg_ctl/initdb appeared under /usr/lib/postgresql/*/bin"
    fi

    if [ -e "$DIR" ] && [ ! -e "$DIR/$MARKER" ] && [ -n "$(ls -A "$DIR" 2>/dev/null)" ]; then
        die "$DIR exists, is not empty and was not made by this script: give a new or empty directory"
    fi
    mkdir -p "$DIR" || die "cannot create $DIR"
    DIR=$(cd "$DIR" && pwd) # absolute: pg_ctl runs from / when root
    DATA=$DIR/data
    touch "$DIR/$MARKER"

    if is_root; then
        id postgres >/dev/null 2>&1 ||
            die "running as root and there is no 'postgres' system user to run the server as (PostgreSQL refuses root)"
        chown -R postgres: "$DIR" || die "cannot chown $DIR to the postgres user"
        as_owner test -w "$DIR" -a -x "$DIR" ||
            die "the postgres user cannot reach $DIR (a parent directory is closed to it): use a directory under /tmp"
    fi

    if running; then
        [ -f "$DIR/url" ] || die "a server runs in $DIR but $DIR/url is missing: stop it with '$PROG stop $DIR'"
        echo "$PROG: PostgreSQL already running: $(cat "$DIR/url")" >&2
        return 0
    fi

    if [ ! -f "$DATA/PG_VERSION" ]; then
        rm -rf "$DATA"
        if ! as_owner "$BINDIR/initdb" -D "$DATA" -U "$ROLE" --auth=trust --encoding=UTF8 --no-locale \
            --no-sync >"$DIR/initdb.log" 2>&1; then
            show_log "$DIR/initdb.log"
            die "initdb failed (output above, in $DIR/initdb.log)"
        fi
        cat >>"$DATA/postgresql.conf" <<EOF

# scripts/test-postgres.sh: a throw-away server for the tests
listen_addresses = '127.0.0.1'
unix_socket_directories = '$DIR'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 200
EOF
        cat >"$DATA/pg_hba.conf" <<EOF
# scripts/test-postgres.sh: trust, on this cluster's private unix socket and on 127.0.0.1 only
local all all trust
host all all 127.0.0.1/32 trust
EOF
    fi

    # The port is picked free just before starting; should another process take it first, pick again.
    local port tries=0
    while :; do
        port=$(free_port)
        tries=$((tries + 1))
        if as_owner "$BINDIR/pg_ctl" start -w -t 60 -D "$DATA" -l "$DIR/server.log" -o "-p $port" \
            >"$DIR/pg_ctl.log" 2>&1; then
            break
        fi
        if [ "$tries" -ge 3 ]; then
            cat "$DIR/pg_ctl.log" >>"$DIR/server.log" 2>/dev/null || true
            show_log "$DIR/server.log"
            die "pg_ctl could not start PostgreSQL in $DATA (log above, in $DIR/server.log)"
        fi
    done

    local exists
    exists=$("$BINDIR/psql" -h 127.0.0.1 -p "$port" -U "$ROLE" -d postgres -XtAq \
        -c "SELECT 1 FROM pg_database WHERE datname = '$DB'" 2>"$DIR/psql.log") || {
        show_log "$DIR/psql.log"
        die "PostgreSQL started on 127.0.0.1:$port but does not accept connections as $ROLE"
    }
    if [ "$exists" != 1 ]; then
        "$BINDIR/createdb" -h 127.0.0.1 -p "$port" -U "$ROLE" "$DB" 2>"$DIR/psql.log" || {
            show_log "$DIR/psql.log"
            die "cannot create the database $DB on 127.0.0.1:$port"
        }
    fi

    local url="postgresql+psycopg://$ROLE@127.0.0.1:$port/$DB"
    echo "$url" >"$DIR/url"
    echo "$PROG: PostgreSQL $(cat "$DATA/PG_VERSION") running: $url (cluster in $DIR)" >&2
}

cmd_stop() {
    [ -e "$DIR" ] || return 0
    [ -e "$DIR/$MARKER" ] || [ -z "$(ls -A "$DIR" 2>/dev/null)" ] ||
        die "$DIR was not made by this script (no $MARKER in it): not removing it"
    DIR=$(cd "$DIR" && pwd)
    DATA=$DIR/data
    if [ -f "$DATA/postmaster.pid" ]; then
        BINDIR=$(find_bindir) || die "a server may run in $DATA but pg_ctl is not found to stop it"
        if running; then
            as_owner "$BINDIR/pg_ctl" stop -w -t 60 -m fast -D "$DATA" >/dev/null 2>&1 ||
                as_owner "$BINDIR/pg_ctl" stop -w -t 30 -m immediate -D "$DATA" >/dev/null 2>&1 ||
                die "cannot stop the PostgreSQL server in $DATA"
        fi
    fi
    rm -rf "$DIR" || die "cannot remove $DIR"
}

cmd_url() {
    [ -f "$DIR/url" ] || die "no PostgreSQL test server in $DIR (run '$PROG start $DIR' first)"
    cat "$DIR/url"
}

[ $# -eq 2 ] && [ -n "$2" ] || usage
DIR=$2
case $1 in
start) cmd_start ;;
stop) cmd_stop ;;
url) cmd_url ;;
*) usage ;;
esac
