#!/usr/bin/env bash
# django_periodic beside django-celery-beat, APScheduler 3 and django-periodic-tasks, one command.
#
#   bash benchmarks/compare/run.sh [--quick] [--only WORKLOAD,...] [--peers ours,celery-beat,apscheduler,dpt]
#
# Builds .venv/bench (Python 3.11: this project, Django 5.2, django-celery-beat, Celery,
# APScheduler 3, SQLAlchemy, matplotlib) and .venv/bench-dpt (Python 3.13, which
# django-periodic-tasks requires), starts a throwaway PostgreSQL with durability on and a
# PgBouncer in transaction mode in front of it (for lag-pgbouncer), runs compare.py and stops
# both. See docs/performance.md; `--help` lists every option.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=scripts/lib/venv.sh
source scripts/lib/venv.sh
# shellcheck source=scripts/lib/postgres.sh
source scripts/lib/postgres.sh
# shellcheck source=scripts/lib/pgbouncer.sh
source scripts/lib/pgbouncer.sh
# shellcheck source=scripts/lib/redis.sh
source scripts/lib/redis.sh

# The ours peer runs tests.settings, which needs the test group's apps installed
# (django-celery-beat, django-health-check).
venv_ensure bench 3.11 -e '.[postgres]' 'django>=5.2,<6' django-environ \
    django-celery-beat celery 'apscheduler>=3.10,<4' sqlalchemy matplotlib \
    'django-tasks>=0.12' 'django-tasks-db>=0.13' 'django-tasks-fennel>=0.1' 'redis>=5' \
    'django-health-check>=4'
dpt_python=
if venv_ensure bench-dpt 3.13 'django>=5.2,<6' 'psycopg[binary]>=3.1' \
    'django-periodic-tasks[django-tasks]'; then
    dpt_python=$PWD/.venv/bench-dpt/bin/python
else
    echo "compare: no Python 3.13 venv for django-periodic-tasks; that peer is left out" >&2
fi

# PgBouncer first: it finds its files under PG_DIR, which pg_stop deletes.
trap 'redis_stop; pgbouncer_stop; pg_stop' EXIT
# Durability on (fsync, synchronous_commit), as in production.
PG_DURABLE=1 pg_start
# Without PgBouncer only lag-pgbouncer is lost (reported as not run), not the whole run.
pgbouncer_start || echo "compare: PgBouncer did not start; lag-pgbouncer is not run" >&2
# Celery's broker and result backend, for handoff-celery (reported as not run without it).
redis_start || echo "compare: Redis did not start; handoff-celery is not run" >&2
BENCH_PG_PORT=$PG_PORT BENCH_PGBOUNCER_PORT=${PGBOUNCER_PORT:-} BENCH_REDIS_PORT=${REDIS_PORT:-} \
    BENCH_DPT_PYTHON=$dpt_python \
    .venv/bench/bin/python benchmarks/compare/compare.py "$@"
