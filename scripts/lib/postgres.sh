# shellcheck shell=bash
# A throwaway PostgreSQL server for tests. Source this file, then:
#
#   pg_start   # initdb + start on 127.0.0.1:<free port>; exports PG_PORT, PG_DIR, PG_BINDIR
#   ...        # connect to postgres://postgres@127.0.0.1:$PG_PORT/periodic (trust auth)
#   pg_stop    # stop the server and delete PG_DIR; safe to call twice
#
# The caller owns the trap (`trap pg_stop EXIT`), so cleanup runs even when tests fail.
# Everything (data, socket, log) lives in one temp dir, so nothing outlives pg_stop.

PG_DB_NAME=${PG_DB_NAME:-periodic}

# Prints the directory holding initdb/pg_ctl; installs postgresql-15 via apt as a last resort.
_pg_find_bindir() {
    local dir
    for dir in "${PG_BINDIR:-}" /usr/local/bin /usr/lib/postgresql/15/bin \
        /usr/lib/postgresql/*/bin "$(dirname "$(command -v pg_ctl 2>/dev/null || echo /nonexistent/x)")"; do
        if [[ -n $dir && -x $dir/initdb && -x $dir/pg_ctl ]]; then
            echo "$dir"
            return 0
        fi
    done
    if ((EUID == 0)) && command -v apt-get >/dev/null; then
        echo "postgres: server binaries not found; installing postgresql-15 with apt" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 >&2 || return 1
        echo /usr/lib/postgresql/15/bin
        return 0
    fi
    echo "postgres: initdb/pg_ctl not found (set PG_BINDIR or install postgresql-15)" >&2
    return 1
}

# PostgreSQL refuses to run as root, so as root we run server commands as the `postgres` user.
# `cd /` because that user usually cannot read the caller's working directory.
_pg_as_owner() {
    if ((EUID == 0)); then
        (cd / && runuser -u postgres -- "$@")
    else
        (cd / && "$@")
    fi
}

_pg_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

pg_start() {
    local bindir port
    bindir=$(_pg_find_bindir) || return 1
    if ((EUID == 0)) && ! id postgres >/dev/null 2>&1; then
        useradd --system --no-create-home --shell /usr/sbin/nologin postgres || return 1
    fi

    # Always under /tmp: the postgres user must be able to traverse the parent directory,
    # which is not true of e.g. a $TMPDIR inside /root.
    PG_DIR=$(mktemp -d /tmp/periodic-pg.XXXXXX) || return 1
    PG_BINDIR=$bindir
    export PG_DIR PG_BINDIR
    if ((EUID == 0)); then chown postgres: "$PG_DIR"; fi

    if ! _pg_as_owner "$bindir/initdb" -D "$PG_DIR/data" -A trust -U postgres -E UTF8 \
        --no-locale --no-sync >"$PG_DIR/initdb.log" 2>&1; then
        echo "postgres: initdb failed:" >&2
        cat "$PG_DIR/initdb.log" >&2
        pg_stop
        return 1
    fi

    # A free port can be taken between probing and binding; retry a few times.
    local attempt
    for attempt in 1 2 3; do
        port=$(_pg_free_port) || { pg_stop; return 1; }
        # Local TCP only, socket in our temp dir; for tests durability off for speed
        # (PG_DURABLE=1 keeps the defaults, for benchmarks that must match production), and
        # each transaction's commit time kept: the crash tests judge what a planner saw
        # committed by it, never by a time the code under test wrote.
        cat >"$PG_DIR/data/postgresql.auto.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$PG_DIR'
max_connections = 200
EOF
        if [[ ${PG_DURABLE:-0} != 1 ]]; then
            printf '%s\n' "fsync = off" "synchronous_commit = off" "full_page_writes = off" \
                "track_commit_timestamp = on" >>"$PG_DIR/data/postgresql.auto.conf"
        fi
        if _pg_as_owner "$bindir/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" \
            -w -t 60 start >/dev/null; then
            PG_PORT=$port
            export PG_PORT
            break
        fi
        echo "postgres: start attempt $attempt on port $port failed" >&2
        if ((attempt == 3)); then
            cat "$PG_DIR/server.log" >&2 || true
            pg_stop
            return 1
        fi
    done

    # Create the database named in the test URL; pytest-django creates its own test_* database
    # from it, but other tools (manage.py, psql) may connect to it directly.
    local createdb
    createdb=$bindir/createdb
    [[ -x $createdb ]] || createdb=$(command -v createdb || true)
    if [[ -n $createdb ]]; then
        "$createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres "$PG_DB_NAME" || { pg_stop; return 1; }
    fi
    echo "postgres: ready on 127.0.0.1:$PG_PORT (data in $PG_DIR)" >&2
}

pg_stop() {
    [[ -n ${PG_DIR:-} && -d $PG_DIR ]] || return 0
    if [[ -f $PG_DIR/data/postmaster.pid ]]; then
        # fast: disconnect clients and stop; immediate/KILL only if that hangs.
        if ! _pg_as_owner "${PG_BINDIR}/pg_ctl" -D "$PG_DIR/data" -m fast -w -t 30 stop >/dev/null 2>&1 &&
            ! _pg_as_owner "${PG_BINDIR}/pg_ctl" -D "$PG_DIR/data" -m immediate -w -t 10 stop >/dev/null 2>&1; then
            local pid
            pid=$(head -n1 "$PG_DIR/data/postmaster.pid" 2>/dev/null || true)
            if [[ $pid =~ ^[0-9]+$ ]]; then kill -KILL "$pid" 2>/dev/null || true; fi
        fi
    fi
    rm -rf "$PG_DIR"
    unset PG_DIR PG_PORT
}
