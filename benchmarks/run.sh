#!/usr/bin/env bash
# Run benchmarks/bench.py on a throwaway PostgreSQL and on SQLite, with the test venv.
#   bash benchmarks/run.sh [--quick]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/venv.sh
source scripts/lib/venv.sh
# shellcheck source=scripts/lib/postgres.sh
source scripts/lib/postgres.sh

venv_ensure py311-django52 3.11 -e '.[postgres]' --group test ruff 'django>=5.2,<6'
python=$PWD/.venv/py311-django52/bin/python
trap pg_stop EXIT
# Durability on (fsync, synchronous_commit), as in production.
PG_DURABLE=1 pg_start
PERIODIC_TEST_DB=postgres PERIODIC_TEST_DB_NAME=$PG_DB_NAME \
    PERIODIC_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$PG_PORT/$PG_DB_NAME" \
    "$python" benchmarks/bench.py "$@"
# prune_runs on a million runs (--quick: 100,000); it seeds them with PostgreSQL's SQL.
PERIODIC_TEST_DB=postgres PERIODIC_TEST_DB_NAME=$PG_DB_NAME \
    PERIODIC_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$PG_PORT/$PG_DB_NAME" \
    "$python" benchmarks/prune.py "$@"
# One fire fanned out to 10,000 scopes.
PERIODIC_TEST_DB=postgres PERIODIC_TEST_DB_NAME=$PG_DB_NAME \
    PERIODIC_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$PG_PORT/$PG_DB_NAME" \
    "$python" benchmarks/fanout.py "$@"
# Planning and idle cost with 100,000 schedules, plain and with features (stagger) in use.
PERIODIC_TEST_DB=postgres PERIODIC_TEST_DB_NAME=$PG_DB_NAME \
    PERIODIC_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$PG_PORT/$PG_DB_NAME" \
    "$python" benchmarks/features.py "$@"
# The admin's overview page with 10,000 schedules and 1,000,000 runs (--quick: 1,000, 100,000).
PERIODIC_TEST_DB=postgres PERIODIC_TEST_DB_NAME=$PG_DB_NAME \
    PERIODIC_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$PG_PORT/$PG_DB_NAME" \
    "$python" benchmarks/overview.py "$@"
rm -f /tmp/periodic-bench.sqlite3*
PERIODIC_TEST_DB=sqlite PERIODIC_TEST_DB_NAME=/tmp/periodic-bench.sqlite3 "$python" benchmarks/bench.py "$@"
rm -f /tmp/periodic-bench.sqlite3*
