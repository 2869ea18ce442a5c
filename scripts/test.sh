#!/usr/bin/env bash
# The test command: bash scripts/test.sh [pytest args...]
#
# Builds the support-matrix virtualenvs under .venv/, starts a throwaway PostgreSQL, lints, checks
# for missing migrations, then runs pytest on every (environment, database) pair. All runs happen
# even if one fails; the exit status is non-zero if anything failed. The last line of output is
# "N passed, M failed" (tests over all pytest runs), for CI to read.
#
# Optional environment:
#   PERIODIC_TEST_ENVS="py311-django52 py312-django6 py313-django6"
#                                                       which environments to run (default: all)
#   PERIODIC_TEST_DBS="sqlite postgres pgbouncer"       which databases to run (default: all three;
#                                                       pgbouncer: PostgreSQL through PgBouncer in
#                                                       transaction mode, the tests marked pgbouncer)
#   PERIODIC_TEST_BESIDE=0                              run every pytest run alone (by default, a
#                                                       stage's runs go side by side: see STAGES)
#   PERIODIC_SKIP_LINT=1                                skip ruff and mypy (handy with -k while iterating)
#   PERIODIC_SKIP_EXAMPLE=1                             skip the example project's set-up check
#   PERIODIC_BROWSER_TESTS=0                            skip the browser tests (and installing Chromium)
#
# Every service a selected run needs (PostgreSQL, PgBouncer, Redis, Chromium) is required: one
# that cannot be installed or started fails the script at once, saying which. A run of the
# whole suite (no pytest arguments) also fails if it collects nothing, or if its skips differ
# from those tests/skips.py declares for it (unless PERIODIC_TEST_ENVS, PERIODIC_TEST_DBS or
# PERIODIC_BROWSER_TESTS narrow it). .ci/run clears the variables above.
#   PERIODIC_SKIP_PACKAGE=1                             skip building and smoke-testing the wheel and sdist
#   PERIODIC_SKIP_DOCS=1                                skip building the documentation site
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=scripts/lib/venv.sh
source scripts/lib/venv.sh
# shellcheck source=scripts/lib/postgres.sh
source scripts/lib/postgres.sh
# shellcheck source=scripts/lib/pgbouncer.sh
source scripts/lib/pgbouncer.sh
# shellcheck source=scripts/lib/redis.sh
source scripts/lib/redis.sh
# shellcheck source=scripts/lib/package.sh
source scripts/lib/package.sh

# The support matrix: name, Python version, Django requirement, the databases it runs on, and
# optionally a pytest marker expression narrowing what that environment runs. The crash suite
# (about 6 minutes: it kills and restarts real schedulers and PostgreSQL) and the upgrade test
# (tests/test_upgrades.py: the previous release's processes beside this one's) run once, with
# Django 5.2 LTS on PostgreSQL; the two supported pairs (3.11 with Django 5.2, 3.12 with Django
# 6) run everything else on both databases (real scheduler processes included), and Python
# 3.13 on SQLite. The tests marked pgbouncer run once more through PgBouncer, with Django 5.2.
# The browser tests run once per invocation, in the first run (see browser_skip).
MATRIX=(
    "py311-django52 3.11 django>=5.2,<6 sqlite,postgres,pgbouncer"
    "py312-django6 3.12 django>=6.0,<7 sqlite,postgres not crash and not upgrade"
    "py313-django6 3.13 django>=6.0,<7 sqlite not crash and not upgrade"
)
# The order of the pytest runs, a stage a line: ENV/DB, or ENV/DB:MARKERS for a part of that
# run (with the matrix's markers), runs separated by "|". A stage's first run goes in the
# foreground, the others beside it: each waits on its own scheduler processes and database
# much of the time, so on 2 cores two runs side by side take little longer than the longer
# alone. The crash suite and the upgrade test (they restart PostgreSQL and kill processes) have
# a stage of their own; so does nothing else.
STAGES=(
    "py311-django52/sqlite|py311-django52/pgbouncer"
    "py311-django52/postgres:not crash and not upgrade|py313-django6/sqlite"
    "py311-django52/postgres:crash or upgrade"
    "py312-django6/postgres|py312-django6/sqlite"
)
# Installed without their dependencies (see scripts/lib/venv.sh): django-celery-beat caps
# Django and cron-descriptor below what the matrix tests; its other dependencies are in the
# test group of pyproject.toml.
TEST_NO_DEPS=("django-celery-beat>=2.9")
ALL_ENVS=
for _spec in "${MATRIX[@]}"; do ALL_ENVS+="${_spec%% *} "; done
SELECTED_ENVS=${PERIODIC_TEST_ENVS:-$ALL_ENVS}
SELECTED_DBS=${PERIODIC_TEST_DBS:-sqlite postgres pgbouncer}

# Results, in run order: labels, pytest exit codes, check names/results.
RUN_LABELS=()
RUN_CODES=()
CHECK_LABELS=()
CHECK_CODES=()

banner() { printf '\n== %s ==\n' "$*"; }

selected() { [[ " $2 " == *" $1 "* ]]; }

# ---------------------------------------------------------------------------------------------
# Prints what is missing and stops the script: a service the tests need could not be had.
missing() {
    printf '\nFAILED: %s\n' "$*" >&2
    exit 1
}

# Browser tests (tests/browser) drive Debian's chromium with Playwright; the Python side finds it
# through PERIODIC_CHROMIUM, or skips with the reason in PERIODIC_BROWSER_SKIP. They serve the
# example project on its own SQLite file, so they run once per invocation (the first pytest run).
ensure_chromium() {
    local found
    if [[ ${PERIODIC_BROWSER_TESTS:-1} == 0 ]]; then
        export PERIODIC_BROWSER_SKIP="browser tests turned off (PERIODIC_BROWSER_TESTS=0)"
        return 0
    fi
    if [[ -n ${PERIODIC_CHROMIUM:-} && -x $PERIODIC_CHROMIUM ]]; then
        return 0
    fi
    if ! command -v chromium >/dev/null; then
        echo "installing chromium for browser tests" >&2
        { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } ||
            missing "the browser tests need Chromium, and apt-get install chromium failed" \
                "(see above; PERIODIC_BROWSER_TESTS=0 leaves them out on a developer's machine)"
    fi
    found=$(command -v chromium) ||
        missing "the browser tests need Chromium, and no chromium is on PATH after installing it"
    export PERIODIC_CHROMIUM=$found
}

# The label of the pytest run that runs the browser tests: the first one started (its stage's
# foreground run); the others skip them.
BROWSER_RUN=

# Why the pytest run labelled $1 skips the browser tests (empty: it runs them).
browser_skip() {
    [[ -n $BROWSER_RUN ]] || BROWSER_RUN=$1
    if [[ -n ${PERIODIC_BROWSER_SKIP:-} ]]; then
        echo "$PERIODIC_BROWSER_SKIP"
    elif [[ $BROWSER_RUN != "$1" ]]; then
        echo "browser tests run once per test.sh, in its first run" # tests/skips.py's reason
    fi
}
# ---------------------------------------------------------------------------------------------

setup_envs() {
    local spec name pyver django
    local -a VENV_NO_DEPS=("${TEST_NO_DEPS[@]}") # for these venvs only, not package.sh's
    for spec in "${MATRIX[@]}"; do
        read -r name pyver django _ <<<"$spec"
        selected "$name" "$SELECTED_ENVS" || continue
        venv_ensure "$name" "$pyver" -e '.[postgres,holidays]' --group test ruff "$django"
    done
}

# Runs a check command, recording (not propagating) its exit code.
run_check() {
    local label=$1 rc=0
    shift
    banner "$label"
    "$@" || rc=$?
    CHECK_LABELS+=("$label")
    CHECK_CODES+=("$rc")
}

# Runs a command with a venv's bin first on PATH, so subprocesses the tests start (e.g.
# `python manage.py run_scheduler`) use the same interpreter.
in_venv() {
    local dir=$PWD/$VENV_ROOT/$1
    shift
    local cmd=$1
    shift
    [[ -x $dir/bin/$cmd ]] && cmd=$dir/bin/$cmd
    VIRTUAL_ENV=$dir PATH=$dir/bin:$PATH "$cmd" "$@"
}

lint() {
    in_venv py311-django52 ruff check . && in_venv py311-django52 ruff format --check .
}

# mypy --strict on django_periodic/ (the package ships py.typed); configured in pyproject.toml.
typecheck() {
    in_venv py311-django52 mypy
}

# The README's first command, end to end but without starting the servers: a fresh venv,
# migrate, the admin user, one `run_scheduler --once` and `manage.py check`, on a temp SQLite.
check_example() {
    local db rc=0
    db=$(mktemp -d)
    DATABASE_URL="sqlite:///$db/example.sqlite3" bash scripts/run-example.sh --check || rc=$?
    rm -rf "$db"
    return "$rc"
}

# The documentation site, warnings as errors (scripts/docs.sh), into a temp dir. Its Python
# examples run in every pytest run below (conftest.py).
check_docs() {
    local out rc=0
    out=$(mktemp -d)
    bash scripts/docs.sh "$out" || rc=$?
    rm -rf "$out"
    return "$rc"
}

check_migrations() {
    DJANGO_SETTINGS_MODULE=tests.settings PYTHONPATH=. PERIODIC_TEST_DB=sqlite \
        in_venv "$1" python -m django makemigrations --check --dry-run django_periodic tests
}

# "py3.11 / Django 5.2.8" for banners and the summary.
env_label() {
    in_venv "$1" python -c 'import sys, django; print("py%d.%d / Django %s" % (*sys.version_info[:2], django.__version__))'
}

# Test counts over all runs, read from pytest's closing line, for the final summary line.
TESTS_PASSED=0
TESTS_FAILED=0

count_tests() {
    local line n word
    # "=== 3 failed, 540 passed in 99.1s ===", or without the rules under -q.
    line=$(grep -E '^(=+ )?[0-9]+ [a-z]+.* in [0-9.]+s' "$1" | tail -n 1 || true)
    for word in passed failed errors error; do
        n=$(grep -Eo "[0-9]+ $word\b" <<<"$line" | grep -Eo '[0-9]+' || true)
        [[ -n $n ]] || continue
        if [[ $word == passed ]]; then
            TESTS_PASSED=$((TESTS_PASSED + n))
        else
            TESTS_FAILED=$((TESTS_FAILED + n))
        fi
    done
}

# Whether pytest arguments select by marker (-m EXPR, -mEXPR), which replaces the matrix's.
has_marker_arg() {
    local arg
    for arg in "$@"; do
        if [[ $arg == -m* ]]; then return 0; fi
    done
    return 1
}

# pytest_setup NAME DB MARKERS [pytest args...]: the label of a pytest run (RUN_LABEL), its
# database (RUN_DB), its extra pytest arguments (RUN_NARROW) and PgBouncer URL (RUN_PGBOUNCER).
# MARKERS is the run's marker expression (may be empty), passed as -m unless the arguments
# have a -m of their own. DB pgbouncer runs the tests marked pgbouncer on PostgreSQL through
# PgBouncer.
pytest_setup() {
    local name=$1 markers=$3
    RUN_DB=$2
    shift 3
    RUN_NARROW=()
    RUN_PGBOUNCER=
    RUN_LABEL="$(env_label "$name") / $RUN_DB"
    if [[ $RUN_DB == pgbouncer ]]; then
        markers="pgbouncer${markers:+ and ($markers)}"
        RUN_PGBOUNCER="postgres://postgres@127.0.0.1:$PGBOUNCER_PORT/$PG_DB_NAME"
        # PgBouncer keeps server connections to the test database, so it cannot be dropped.
        RUN_NARROW=(--reuse-db)
        RUN_DB=postgres
    fi
    if [[ -n $markers ]] && ! has_marker_arg "$@"; then
        RUN_NARROW+=(-m "$markers")
        RUN_LABEL+=" ($markers)"
    fi
}

# pytest_exec NAME ONLY_DB [pytest args...]: the run pytest_setup described. ONLY_DB=1 leaves out
# the tests that never reach the database (tests/conftest.py), which another run of the same
# environment runs.
pytest_exec() {
    local name=$1 only_db=$2
    shift 2
    PERIODIC_BROWSER_SKIP=$(browser_skip "$RUN_LABEL") PERIODIC_TEST_DB=$RUN_DB \
        PERIODIC_ONLY_DATABASE_TESTS=$only_db PERIODIC_TEST_PGBOUNCER_URL=$RUN_PGBOUNCER \
        PERIODIC_EXPECTED_SKIPS=$(expected_skips_key) \
        in_venv "$name" python -m pytest -p no:cacheprovider "${RUN_NARROW[@]}" "$@"
}

# The run whose skips tests/skips.py checks (its stage part), or nothing when the caller
# narrowed the command (NARROWED: pytest arguments, or fewer environments, databases or
# browser tests), whose runs may skip what they like.
NARROWED=0
RUN_PART=
expected_skips_key() {
    ((NARROWED)) || echo "$RUN_PART"
}

# record_run LABEL LOG RC: counts a finished run's tests and keeps its result for the summary.
record_run() {
    count_tests "$2"
    rm -f "$2"
    RUN_LABELS+=("$1")
    RUN_CODES+=("$3")
}

# run_pytest NAME DB MARKERS ONLY_DB [pytest args...]: one pytest run, in the foreground.
run_pytest() {
    local name=$1 db=$2 markers=$3 only_db=$4 log rc=0
    shift 4
    pytest_setup "$name" "$db" "$markers" "$@"
    banner "$RUN_LABEL"
    log=$(mktemp)
    browser_skip "$RUN_LABEL" >/dev/null # the first run claims them
    pytest_exec "$name" "$only_db" "$@" 2>&1 | tee "$log" || rc=${PIPESTATUS[0]}
    record_run "$RUN_LABEL" "$log" "$rc"
}

# start_beside NAME DB MARKERS ONLY_DB [pytest args...]: one pytest run in the background,
# beside its stage's foreground run (finish_beside prints its output once it has ended). It
# gets its own pytest temp dir; its SQLite file is per process (tests/settings.py).
BESIDE_PIDS=()
BESIDE_LABELS=()
BESIDE_LOGS=()
BESIDE_TMPS=()
start_beside() {
    local name=$1 db=$2 markers=$3 only_db=$4 log tmp
    shift 4
    pytest_setup "$name" "$db" "$markers" "$@"
    log=$(mktemp)
    tmp=$(mktemp -d)
    echo "(running $RUN_LABEL beside; its output follows when it ends)"
    pytest_exec "$name" "$only_db" --basetemp "$tmp/pytest" "$@" >"$log" 2>&1 &
    BESIDE_PIDS+=("$!")
    BESIDE_LABELS+=("$RUN_LABEL")
    BESIDE_LOGS+=("$log")
    BESIDE_TMPS+=("$tmp")
}

stop_beside() {
    local pid
    for pid in "${BESIDE_PIDS[@]}"; do
        pkill -TERM -P "$pid" 2>/dev/null || true # pytest, under the background subshell
        kill "$pid" 2>/dev/null || true
    done
}

finish_beside() {
    local i rc
    for i in "${!BESIDE_PIDS[@]}"; do
        rc=0
        wait "${BESIDE_PIDS[$i]}" || rc=$?
        banner "${BESIDE_LABELS[$i]} (ran beside the run above)"
        cat "${BESIDE_LOGS[$i]}"
        record_run "${BESIDE_LABELS[$i]}" "${BESIDE_LOGS[$i]}" "$rc"
        rm -rf "${BESIDE_TMPS[$i]}"
    done
    BESIDE_PIDS=()
    BESIDE_LABELS=()
    BESIDE_LOGS=()
    BESIDE_TMPS=()
}

# The matrix's fields for environment $1: "DATABASES MARKERS" (MARKERS may be empty).
env_spec() {
    local spec name _pyver _django databases markers
    for spec in "${MATRIX[@]}"; do
        read -r name _pyver _django databases markers <<<"$spec"
        if [[ $name == "$1" ]]; then
            echo "$databases $markers"
            return 0
        fi
    done
    return 1
}

# Whether ENV/DB is selected (PERIODIC_TEST_ENVS, PERIODIC_TEST_DBS) and in the matrix.
run_selected() {
    local databases _markers
    read -r databases _markers <<<"$(env_spec "$1")"
    selected "$1" "$SELECTED_ENVS" && selected "$2" "$SELECTED_DBS" &&
        selected "$2" "${databases//,/ }"
}

# part_setup ENV/DB[:MARKERS]: a stage's run as PART_ENV, PART_DB, PART_MARKERS (the matrix's
# and the part's) and PART_ONLY_DB. The SQLite run of an environment runs every test; its other
# runs only those that reach the database, unless its SQLite run is not selected.
part_setup() {
    local part=$1 _databases extra=
    PART_ENV=${part%%/*}
    PART_DB=${part#*/}
    PART_DB=${PART_DB%%:*}
    [[ $part != *:* ]] || extra=${part#*:}
    read -r _databases PART_MARKERS <<<"$(env_spec "$PART_ENV")"
    if [[ -n $extra && -n $PART_MARKERS ]]; then
        PART_MARKERS="($PART_MARKERS) and ($extra)"
    elif [[ -n $extra ]]; then
        PART_MARKERS=$extra
    fi
    PART_ONLY_DB=0
    if [[ $PART_DB != sqlite ]] && run_selected "$PART_ENV" sqlite; then
        PART_ONLY_DB=1
    fi
}

# stage_run FOREGROUND ENV/DB[:MARKERS] [pytest args...]: one run of a stage.
stage_run() {
    local foreground=$1
    part_setup "$2"
    RUN_PART=$2
    shift 2
    if ((foreground)); then
        run_pytest "$PART_ENV" "$PART_DB" "$PART_MARKERS" "$PART_ONLY_DB" "$@"
    else
        start_beside "$PART_ENV" "$PART_DB" "$PART_MARKERS" "$PART_ONLY_DB" "$@"
    fi
}

# The ENV/DB pairs a stage has run so far (see run_stage).
STAGED=" "

# run_stage STAGE [pytest args...]: the stage's selected runs, the others beside its first
# (one after the other with PERIODIC_TEST_BESIDE=0).
run_stage() {
    local part
    local -a parts=() chosen=()
    IFS='|' read -r -a parts <<<"$1"
    shift
    for part in "${parts[@]}"; do
        part_setup "$part"
        run_selected "$PART_ENV" "$PART_DB" || continue
        # A -m of the caller's replaces the parts' markers: the first part runs it whole.
        if has_marker_arg "$@" && [[ $STAGED == *" $PART_ENV/$PART_DB "* ]]; then continue; fi
        STAGED+="$PART_ENV/$PART_DB "
        chosen+=("$part")
    done
    ((${#chosen[@]})) || return 0
    if [[ ${PERIODIC_TEST_BESIDE:-1} != 1 ]]; then
        for part in "${chosen[@]}"; do stage_run 1 "$part" "$@"; done
        return 0
    fi
    # The first run claims the browser tests before the others start.
    part_setup "${chosen[0]}"
    pytest_setup "$PART_ENV" "$PART_DB" "$PART_MARKERS" "$@"
    browser_skip "$RUN_LABEL" >/dev/null
    for part in "${chosen[@]:1}"; do stage_run 0 "$part" "$@"; done
    stage_run 1 "${chosen[0]}" "$@"
    finish_beside
}

describe_code() {
    case $1 in
        0) echo "passed" ;;
        1) echo "FAILED (tests failed)" ;;
        2) echo "FAILED (interrupted or collection error)" ;;
        5) echo "no tests collected" ;;
        *) echo "FAILED (exit $1)" ;;
    esac
}

# Prints the summary table and the final "N passed, M failed" line (tests over all runs);
# returns non-zero on failure.
summarize() {
    local i rc passed=0 failed=0 empty=0 checks_failed=0
    for rc in "${RUN_CODES[@]}"; do
        if ((rc == 5)); then empty=$((empty + 1)); fi
    done

    banner "summary"
    for i in "${!CHECK_LABELS[@]}"; do
        rc=${CHECK_CODES[$i]}
        if ((rc != 0)); then checks_failed=$((checks_failed + 1)); fi
        printf '  %-45s %s\n' "${CHECK_LABELS[$i]}" "$( ((rc == 0)) && echo ok || echo "FAILED (exit $rc)")"
    done
    for i in "${!RUN_LABELS[@]}"; do
        rc=${RUN_CODES[$i]}
        # "No tests collected" is fine for one run of a narrowed selection (e.g. -k matching
        # only some files), but if no run collected anything, or a run of the whole suite
        # collected nothing (a marker renamed), the selection or the collection is broken.
        if ((rc == 0)) || { ((rc == 5 && NARROWED)) && ((empty < ${#RUN_CODES[@]})); }; then
            passed=$((passed + 1))
        else
            failed=$((failed + 1))
        fi
        printf '  %-45s %s%s\n' "${RUN_LABELS[$i]}" "$(describe_code "$rc")" \
            "$( ((rc == 5 && (!NARROWED || empty == ${#RUN_CODES[@]}))) && echo ": FAILED")"
    done
    if ((checks_failed > 0)); then
        echo "  ($checks_failed check(s) failed: the script fails even if every pytest run passed)"
    fi
    echo "  pytest runs: $passed passed, $failed failed"
    echo "$TESTS_PASSED passed, $TESTS_FAILED failed"
    ((failed == 0 && checks_failed == 0 && ${#RUN_CODES[@]} > 0))
}

main() {
    # Ctrl-C: stop after the current step instead of carrying on with the next run.
    trap 'exit 130' INT
    trap 'exit 143' TERM
    trap 'stop_beside; redis_stop; pgbouncer_stop; pg_stop' EXIT
    # The whole suite, as CI runs it: no pytest arguments, no narrowing of the matrix.
    if (($#)) || [[ -n ${PERIODIC_TEST_ENVS:-}${PERIODIC_TEST_DBS:-}${PERIODIC_BROWSER_TESTS:-} ]]; then
        NARROWED=1
    fi

    ensure_chromium

    setup_envs

    if selected postgres "$SELECTED_DBS" || selected pgbouncer "$SELECTED_DBS"; then
        pg_start || missing "the PostgreSQL tests need a server, and it could not start"
        export PERIODIC_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$PG_PORT/$PG_DB_NAME"
    fi
    if selected pgbouncer "$SELECTED_DBS"; then
        pgbouncer_start || missing "the PgBouncer tests need PgBouncer, and it could not start"
    fi
    # Celery's broker and result backend, for the hand-off to Celery workers (PostgreSQL).
    if [[ -n ${PG_PORT:-} ]]; then
        redis_start || missing "the Celery hand-off tests need Redis, and it could not start"
        export PERIODIC_TEST_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
    fi

    if [[ ${PERIODIC_SKIP_LINT:-0} != 1 ]] && selected py311-django52 "$SELECTED_ENVS"; then
        run_check "lint (ruff check, ruff format --check)" lint
        run_check "types (mypy --strict)" typecheck
    fi

    if [[ ${PERIODIC_SKIP_EXAMPLE:-0} != 1 ]]; then
        run_check "example project (scripts/run-example.sh --check)" check_example
    fi

    if [[ ${PERIODIC_SKIP_DOCS:-0} != 1 ]]; then
        run_check "docs (scripts/docs.sh, sphinx -W)" check_docs
    fi

    local spec name stage
    for spec in "${MATRIX[@]}"; do
        name=${spec%% *}
        selected "$name" "$SELECTED_ENVS" || continue
        run_check "migrations up to date ($name)" check_migrations "$name"
    done

    for stage in "${STAGES[@]}"; do
        run_stage "$stage" "$@"
    done

    # Last, so that the work tree it copies has the leftovers of the runs above (bytecode,
    # SQLite files) for the contents check to keep out of the sdist.
    if [[ ${PERIODIC_SKIP_PACKAGE:-0} != 1 ]]; then
        run_check "package (build, contents, smoke tests, example project)" package_check
    fi

    summarize
}

main "$@"
