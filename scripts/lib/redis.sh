# shellcheck shell=bash
# A throwaway Redis for the Celery hand-off tests. Source this file after
# scripts/lib/postgres.sh (it borrows _pg_free_port), then:
#
#   redis_start   # on 127.0.0.1:<free port>, nothing saved to disk; exports REDIS_PORT
#   redis_stop    # stop it and delete its directory; safe to call twice
#
# Debian's redis-server is installed with apt when missing and we are root.

_redis_find() {
    local found
    found=$(command -v redis-server || true)
    if [[ -z $found ]] && ((EUID == 0)) && command -v apt-get >/dev/null; then
        echo "redis: redis-server not found; installing Debian's package with apt" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >&2 || return 1
        found=$(command -v redis-server || echo /usr/bin/redis-server)
    fi
    [[ -n $found ]] || { echo "redis: redis-server not found (install redis-server)" >&2; return 1; }
    echo "$found"
}

redis_start() {
    local binary port attempt
    binary=$(_redis_find) || return 1
    REDIS_DIR=$(mktemp -d /tmp/periodic-redis.XXXXXX) || return 1
    export REDIS_DIR
    for attempt in 1 2 3; do
        port=$(_pg_free_port) || return 1
        if "$binary" --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
            --daemonize yes --dir "$REDIS_DIR" --pidfile "$REDIS_DIR/redis.pid" \
            --logfile "$REDIS_DIR/redis.log" && _redis_wait "$port"; then
            REDIS_PORT=$port
            export REDIS_PORT
            echo "redis: ready on 127.0.0.1:$REDIS_PORT" >&2
            return 0
        fi
        echo "redis: start attempt $attempt on port $port failed" >&2
    done
    cat "$REDIS_DIR/redis.log" >&2 || true
    redis_stop
    return 1
}

# Waits up to 10 s for the server to answer PING.
_redis_wait() {
    local i
    for i in $(seq 100); do
        [[ $(redis-cli -p "$1" ping 2>/dev/null) == PONG ]] && return 0
        sleep 0.1
    done
    return 1
}

redis_stop() {
    [[ -n ${REDIS_DIR:-} && -d $REDIS_DIR ]] || return 0
    local pid
    pid=$(cat "$REDIS_DIR/redis.pid" 2>/dev/null || true)
    if [[ $pid =~ ^[0-9]+$ ]]; then
        kill -TERM "$pid" 2>/dev/null || true
        # It writes its log as it stops: wait (up to 5 s), or removing its directory fails,
        # and under set -e the rest of the caller's clean-up (PostgreSQL's stop) is skipped.
        local i
        for i in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
    fi
    rm -rf "$REDIS_DIR" || echo "redis: could not remove $REDIS_DIR" >&2
    unset REDIS_DIR REDIS_PORT
}
