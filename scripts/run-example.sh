#!/usr/bin/env bash
# Try the app: bash scripts/run-example.sh [--check]
#
# Creates .venv/example, migrates example_project (SQLite unless DATABASE_URL says otherwise),
# creates an `admin` superuser, then runs the scheduler in the background and the dev server in
# the foreground until Ctrl-C / SIGTERM, when both are stopped.
#
# --check: do the setup, run `run_scheduler --once` and `check`, and exit (for CI).
#
# Environment: PORT (default 8000), ADMIN_PASSWORD (default "admin"), DATABASE_URL,
# SCHEDULER_STOP_TIMEOUT (seconds to wait for a graceful scheduler stop, default 30).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=scripts/lib/venv.sh
source scripts/lib/venv.sh

PORT=${PORT:-8000}
ADMIN_PASSWORD=${ADMIN_PASSWORD:-admin}
CHECK_ONLY=0
case ${1:-} in
    --check) CHECK_ONLY=1 ;;
    "") ;;
    *)
        echo "usage: bash scripts/run-example.sh [--check]" >&2
        exit 2
        ;;
esac

SCHEDULER_PID=
SERVER_PID=

create_admin() {
    local out
    if out=$(DJANGO_SUPERUSER_PASSWORD=$ADMIN_PASSWORD python manage.py createsuperuser \
        --noinput --username admin --email admin@example.com 2>&1); then
        echo "created superuser admin"
    elif [[ $out == *"already taken"* || $out == *"already exists"* ]]; then
        echo "superuser admin already exists (its password was not changed)"
    else
        echo "$out" >&2
        return 1
    fi
}

# Sends SIGTERM, waits up to $2 seconds, then SIGKILL, so nothing outlives the script.
# (SC2317: these run from the EXIT trap, which shellcheck cannot see.)
# shellcheck disable=SC2317
stop_process() {
    local pid=$1 timeout=$2 waited=0
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null && ((waited < timeout * 10)); do
        sleep 0.1
        waited=$((waited + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "pid $pid did not stop within ${timeout}s; killing it" >&2
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

# shellcheck disable=SC2317
cleanup() {
    trap - EXIT INT TERM
    echo
    echo "stopping..."
    stop_process "$SERVER_PID" 10
    stop_process "$SCHEDULER_PID" "${SCHEDULER_STOP_TIMEOUT:-30}"
}

venv_ensure example 3.11 -e '.[postgres]' django-environ
# Activate for the rest of the script so `python` is the venv's.
export VIRTUAL_ENV=$PWD/$VENV_ROOT/example
export PATH=$VIRTUAL_ENV/bin:$PATH
export PYTHONUNBUFFERED=1

cd example_project
python manage.py migrate --noinput
create_admin

if ((CHECK_ONLY)); then
    python manage.py run_scheduler --once
    python manage.py check
    echo "example project OK"
    exit 0
fi

cat <<EOF

  Admin:    http://127.0.0.1:$PORT/admin/
  Login:    admin / $ADMIN_PASSWORD
  Stop:     Ctrl-C

EOF

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Both run in the background and the script waits on them, because bash defers traps while a
# foreground child runs: a SIGTERM to this script would otherwise not stop anything. (Background
# children of a non-interactive shell ignore Ctrl-C; the trap stops them with SIGTERM instead.)
python manage.py run_scheduler &
SCHEDULER_PID=$!
python manage.py runserver "127.0.0.1:$PORT" &
SERVER_PID=$!

# Return when either exits (e.g. the port is taken); the EXIT trap stops the other.
rc=0
wait -n || rc=$?
echo "the scheduler or the server exited (status $rc)" >&2
exit "$rc"
