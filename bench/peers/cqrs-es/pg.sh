#!/usr/bin/env bash
# A throwaway PostgreSQL 15 server for the cqrs-es peer benchmark.
#
#   pg.sh start    initdb (first time only) and start on 127.0.0.1:$EF_PG_PORT, create the
#                  database `cqrs` and the postgres-es schema (schema.sql); a no-op when running
#   pg.sh stop     fast shutdown; a no-op when not running
#   pg.sh status   exit 0 when running, 3 when stopped
#   pg.sh psql ..  psql on the `cqrs` database (extra arguments are passed on)
#   pg.sh reset    stop and delete the whole cluster directory
#   pg.sh url      print the database URL the peer should use
#
# Environment: EF_PG_DIR (default /tmp/eventfold-bench-pg), EF_PG_PORT (default 25432),
# EF_PG_USER (unprivileged OS user that runs the server, default efbench; created with
# `useradd --system` when missing), EF_PG_BIN (directory holding initdb/pg_ctl/postgres,
# default: found on PATH, else /usr/lib/postgresql/15/bin).
#
# Durability is the stock PostgreSQL one and is written out explicitly: fsync=on,
# synchronous_commit=on, full_page_writes=on. Authentication is `trust` and the server
# listens on 127.0.0.1 only: this cluster is for local benchmarks, never for real data.
set -euo pipefail

DIR=${EF_PG_DIR:-/tmp/eventfold-bench-pg}
PORT=${EF_PG_PORT:-25432}
OS_USER=${EF_PG_USER:-efbench}
DATA="$DIR/data"
LOG="$DIR/postgres.log"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCHEMA="$HERE/schema.sql"
DB=cqrs
DB_SUPERUSER=postgres

die() {
    echo "pg.sh: $*" >&2
    exit 1
}

log_tail() {
    if [[ -f $LOG ]]; then
        echo "--- last lines of $LOG ---" >&2
        tail -n 40 "$LOG" >&2 || true
        echo "---" >&2
    fi
}

fail() {
    echo "pg.sh: $*" >&2
    log_tail
    exit 1
}

find_bin() {
    local name=$1
    if [[ -n ${EF_PG_BIN:-} ]]; then
        [[ -x $EF_PG_BIN/$name ]] || die "$EF_PG_BIN/$name not found"
        echo "$EF_PG_BIN/$name"
    elif command -v "$name" >/dev/null 2>&1; then
        command -v "$name"
    elif [[ -x /usr/lib/postgresql/15/bin/$name ]]; then
        echo "/usr/lib/postgresql/15/bin/$name"
    else
        die "$name not found (install Debian's postgresql-15, or set EF_PG_BIN)"
    fi
}

INITDB=$(find_bin initdb)
PG_CTL=$(find_bin pg_ctl)
PSQL=$(find_bin psql)

# Runs a command as the unprivileged server user (postgres refuses to run as root).
as_user() {
    if [[ $(id -u) -eq 0 ]]; then
        runuser -u "$OS_USER" -- "$@"
    else
        "$@"
    fi
}

ensure_user() {
    [[ $(id -u) -eq 0 ]] || return 0 # not root: the server runs as the current user
    if ! id -u "$OS_USER" >/dev/null 2>&1; then
        useradd --system --no-create-home --shell /usr/sbin/nologin "$OS_USER" ||
            die "cannot create the system user $OS_USER"
    fi
}

sql() {
    PGOPTIONS="-c client_min_messages=warning" "$PSQL" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U "$DB_SUPERUSER" "$@"
}

is_running() {
    [[ -f $DATA/PG_VERSION ]] || return 1
    as_user "$PG_CTL" -D "$DATA" status >/dev/null 2>&1
}

init_cluster() {
    ensure_user
    mkdir -p "$DIR"
    if [[ $(id -u) -eq 0 ]]; then
        chown "$OS_USER:" "$DIR"
    fi
    chmod 0700 "$DIR"
    if [[ ! -f $DATA/PG_VERSION ]]; then
        rm -rf "$DATA"
        echo "pg.sh: initdb $DATA" >&2
        as_user "$INITDB" -D "$DATA" -U "$DB_SUPERUSER" --auth=trust --encoding=UTF8 \
            --locale=C >"$DIR/initdb.log" 2>&1 || {
            tail -n 40 "$DIR/initdb.log" >&2
            die "initdb failed (log: $DIR/initdb.log)"
        }
    fi
}

start() {
    if is_running; then
        echo "pg.sh: already running on 127.0.0.1:$PORT (data $DATA)" >&2
    else
        init_cluster
        # Every setting the benchmark depends on is given on the command line, so it holds
        # whatever the cluster's postgresql.conf says and whichever port was asked for.
        local opts=(
            -c listen_addresses=127.0.0.1
            -c port="$PORT"
            -c unix_socket_directories="$DIR"
            -c fsync=on
            -c synchronous_commit=on
            -c full_page_writes=on
            -c wal_sync_method=fdatasync
            -c shared_buffers=256MB
            -c max_connections=200
        )
        echo "pg.sh: starting postgres on 127.0.0.1:$PORT (data $DATA, log $LOG)" >&2
        as_user "$PG_CTL" -D "$DATA" -l "$LOG" -w -t 60 -o "${opts[*]}" start >/dev/null ||
            fail "postgres did not start"
    fi
    local ready=0
    for _ in $(seq 1 60); do
        if pg_isready_ok; then
            ready=1
            break
        fi
        sleep 0.5
    done
    [[ $ready -eq 1 ]] || fail "postgres does not accept connections on 127.0.0.1:$PORT"
    if [[ $(sql -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'") != 1 ]]; then
        sql -d postgres -c "CREATE DATABASE $DB" || fail "cannot create database $DB"
    fi
    sql -d "$DB" -f "$SCHEMA" || fail "cannot create the postgres-es schema"
    # Show what the server actually runs with, so a benchmark log records it.
    sql -d "$DB" -tAc "SELECT string_agg(name || '=' || current_setting(name), ' ' ORDER BY name) FROM pg_settings
        WHERE name IN ('fsync','synchronous_commit','full_page_writes','wal_sync_method',
                       'shared_buffers','max_connections','server_version')" >&2
    echo "pg.sh: ready: $(url)" >&2
}

pg_isready_ok() {
    sql -d postgres -tAc "SELECT 1" >/dev/null 2>&1
}

stop() {
    if is_running; then
        as_user "$PG_CTL" -D "$DATA" -m fast -w -t 60 stop >/dev/null || fail "postgres did not stop"
        echo "pg.sh: stopped" >&2
    else
        echo "pg.sh: not running" >&2
    fi
}

url() {
    echo "postgres://$DB_SUPERUSER@127.0.0.1:$PORT/$DB"
}

case ${1:-} in
start) start ;;
stop) stop ;;
status)
    if is_running; then
        echo "running on 127.0.0.1:$PORT (data $DATA)"
    else
        echo "stopped"
        exit 3
    fi
    ;;
psql)
    shift
    exec "$PSQL" -X -h 127.0.0.1 -p "$PORT" -U "$DB_SUPERUSER" -d "$DB" "$@"
    ;;
reset)
    stop
    rm -rf "$DIR"
    echo "pg.sh: removed $DIR" >&2
    ;;
url) url ;;
*)
    sed -n '2,20p' "$0" >&2
    exit 2
    ;;
esac
