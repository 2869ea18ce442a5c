# shellcheck shell=bash
# A throwaway PgBouncer in transaction mode in front of the throwaway PostgreSQL
# (scripts/lib/postgres.sh). Source this file, then, after pg_start:
#
#   pgbouncer_start   # exports PGBOUNCER_PORT; any database name is passed through
#   pgbouncer_stop    # safe to call twice (pg_stop deletes its files with PG_DIR)
#
# Debian's package (1.18 on bookworm) is installed with apt when missing and we are root.
# Like PostgreSQL it refuses to run as root: as root it runs as the `postgres` user.

_pgbouncer_find() {
    local found
    found=$(command -v pgbouncer || true)
    [[ -z $found && -x /usr/sbin/pgbouncer ]] && found=/usr/sbin/pgbouncer
    if [[ -z $found ]] && ((EUID == 0)) && command -v apt-get >/dev/null; then
        echo "pgbouncer: not found; installing Debian's package with apt" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >&2 || return 1
        found=/usr/sbin/pgbouncer
    fi
    [[ -n $found ]] || { echo "pgbouncer: not found (install pgbouncer)" >&2; return 1; }
    echo "$found"
}

pgbouncer_start() {
    local binary dir port attempt
    binary=$(_pgbouncer_find) || return 1
    dir=$PG_DIR/pgbouncer
    mkdir -p "$dir"
    echo '"postgres" ""' >"$dir/userlist.txt"
    if ((EUID == 0)); then chown -R postgres: "$dir"; fi
    for attempt in 1 2 3; do
        port=$(_pg_free_port) || return 1
        # Transaction pooling, as deployments that outgrow one box run it. The pool is smaller
        # than the clients a test starts (three schedulers with eight workers each), so
        # clients wait for a server connection, as they do in production.
        cat >"$dir/pgbouncer.ini" <<CONF
[databases]
* = host=127.0.0.1 port=$PG_PORT
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = 20
max_client_conn = 1000
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
admin_users = postgres
ignore_startup_parameters = extra_float_digits,options
CONF
        if _pg_as_owner "$binary" -d "$dir/pgbouncer.ini" && _pgbouncer_wait "$port"; then
            PGBOUNCER_PORT=$port
            export PGBOUNCER_PORT
            echo "pgbouncer: ready on 127.0.0.1:$PGBOUNCER_PORT, transaction pooling" >&2
            return 0
        fi
        echo "pgbouncer: start attempt $attempt on port $port failed" >&2
        pgbouncer_stop
    done
    cat "$dir/pgbouncer.log" >&2 || true
    return 1
}

# Waits up to 10 s for the port to accept connections.
_pgbouncer_wait() {
    python3 - "$1" <<'PY'
import socket, sys, time
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit(1)
PY
}

pgbouncer_stop() {
    local pidfile=${PG_DIR:-/nonexistent}/pgbouncer/pgbouncer.pid pid
    [[ -f $pidfile ]] || return 0
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [[ $pid =~ ^[0-9]+$ ]]; then kill -TERM "$pid" 2>/dev/null || true; fi
    rm -f "$pidfile"
    unset PGBOUNCER_PORT
}
