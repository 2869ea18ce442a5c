# shellcheck shell=bash
# Build the wheel and the sdist, check what they hold, and smoke-test each in a fresh virtualenv.
# Source from the repo root after scripts/lib/venv.sh, then:
#
#   package_check   # prints one line per step; returns non-zero if any step failed
#
# The artefacts are built with `python -m build` (from a tool venv, .venv/build) out of a copy
# of the work tree, so the checkout gets no egg-info and no build/ directory. The copy keeps the
# local leftovers a real checkout has (bytecode, SQLite files), so that the contents check
# (scripts/package/contents.py) would see them if MANIFEST.in let them in. Each artefact is then
# installed with plain `pip install` into a new venv in a temp dir and driven by
# scripts/package/smoke/smoke.py from a throwaway project: migrate, check, a job run by
# run_scheduler --once, the admin's templates and static files. The wheel's venv then gets
# django-environ and runs a copy of example_project/ outside the checkout, on SQLite in the temp
# dir, as scripts/run-example.sh sets it up: django_periodic must come from site-packages, then
# check, migrate, createsuperuser, a manual run of demo.jobs.greet and `run_scheduler --once`,
# after which the run must be found succeeded through the ORM.

# The wheel is tried on the oldest supported Python (pip picks Django 5.2 there) and the sdist on
# the newest (Django 6): both ends of the support matrix for the price of two installs.
PACKAGE_WHEEL_PYTHON=3.11
PACKAGE_SDIST_PYTHON=3.13

# Runs a step with its output in a log, shown only when it fails; prints "  <label>: N s".
_package_step() {
    local label=$1 log=$2 start=$SECONDS rc=0
    shift 2
    "$@" >"$log" 2>&1 || rc=$?
    if ((rc != 0)); then
        echo "  $label: FAILED (exit $rc); its output:"
        sed 's/^/    | /' "$log"
        return "$rc"
    fi
    echo "  $label: $((SECONDS - start)) s"
}

# Copies the work tree to $1 without .git, venvs and earlier build output.
_package_copy_tree() {
    mkdir -p "$1"
    tar -C . --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist \
        --exclude='*.egg-info' -cf - . | tar -C "$1" -xf -
}

_package_build() {
    local work=$1
    _package_copy_tree "$work/src" &&
        "$PWD/$VENV_ROOT/build/bin/python" -m build --outdir "$work/dist" "$work/src"
}

# _package_smoke ARTEFACT X.Y DIR: a fresh venv in DIR, `pip install ARTEFACT`, then smoke.py run
# from a copy of the smoke project, with nothing from this shell's environment that could point
# Python or Django at the checkout.
_package_smoke() {
    local artefact=$1 pyver=$2 dir=$3 python
    python=$(venv_find_python "$pyver") || return 1
    "$python" -m venv "$dir/venv" || return 1
    _package_step "pip install $(basename "$artefact") (Python $pyver)" "$dir/pip.log" \
        _venv_pip "$dir/venv/bin/python" install "$artefact" || return 1
    cp -R scripts/package/smoke "$dir/project" || return 1
    (
        cd "$dir/project" &&
            env -u PYTHONPATH -u DJANGO_SETTINGS_MODULE -u VIRTUAL_ENV \
                "$dir/venv/bin/python" smoke.py
    )
}

# Runs manage.py of the example project copied to DIR/example with the venv DIR/venv, on
# DIR/example/db.sqlite3, with nothing from this shell's environment that could point Python,
# Django or the settings elsewhere.
_package_manage() {
    local dir=$1
    shift
    (
        cd "$dir/example" &&
            env -u PYTHONPATH -u DJANGO_SETTINGS_MODULE -u VIRTUAL_ENV \
                DATABASE_URL="sqlite:///$dir/example/db.sqlite3" \
                "$dir/venv/bin/python" manage.py "$@"
    )
}

# Fails unless django_periodic comes from the venv's site-packages; then the example project's
# set-up, as scripts/run-example.sh does it.
_package_example_setup() {
    local dir=$1
    _package_manage "$dir" shell -c '
import sysconfig
from pathlib import Path
import django_periodic
where = Path(django_periodic.__file__).resolve()
site = Path(sysconfig.get_paths()["purelib"]).resolve()
if not where.is_relative_to(site):
    raise SystemExit(f"django_periodic imported from {where}, not from {site}")
print(f"django_periodic imported from {where}")' &&
        _package_manage "$dir" check --fail-level WARNING &&
        _package_manage "$dir" migrate --noinput &&
        DJANGO_SUPERUSER_PASSWORD="admin" _package_manage "$dir" createsuperuser --noinput \
            --username admin --email admin@example.com
}

# A manual run of the example's demo.jobs.greet, then `run_scheduler --once`; checked through the
# ORM, not the exit codes: the run succeeded with greet's message, and the scheduler created the
# schedules of the example's decorated jobs.
_package_example_run() {
    local dir=$1
    _package_manage "$dir" shell -c '
from django_periodic.models import Schedule
schedule = Schedule(name="greet", job="demo.jobs.greet", args=["World"], cron="0 3 * * *")
schedule.full_clean()
schedule.save()
print(f"requested run {schedule.run_now().pk}")' &&
        _package_manage "$dir" run_scheduler --once &&
        _package_manage "$dir" shell -c '
from django_periodic.models import Run, Schedule
run = Run.objects.get(schedule__name="greet")
if run.status != Run.Status.SUCCEEDED or run.result != "Hello, World!":
    raise SystemExit(f"run {run.pk}: {run.status} {run.result!r} {run.error_message}")
decorated = {f"demo.jobs.{name}" for name in ("tidy_sessions", "flaky_sync", "slow_report")}
names = set(Schedule.objects.values_list("name", flat=True))
if not decorated <= names:
    raise SystemExit(f"schedules of the decorated jobs missing: {sorted(names)}")
print(f"run {run.pk} {run.status}: {run.result!r}; schedules: {sorted(names)}")'
}

# _package_example DIR: the example project, copied out of the checkout (without its local
# database or .env), run against the artefact installed in the venv DIR/venv.
_package_example() {
    local dir=$1
    _package_step "pip install django-environ (the example project's settings)" \
        "$dir/example-pip.log" _venv_pip "$dir/venv/bin/python" install django-environ || return 1
    cp -R example_project "$dir/example" || return 1
    rm -f "$dir/example/.env" "$dir/example"/db.sqlite3*
    _package_step "example project: check, migrate, createsuperuser (package from site-packages)" \
        "$dir/example-setup.log" _package_example_setup "$dir" || return 1
    _package_step "example project: run_scheduler --once ran demo.jobs.greet" \
        "$dir/example-run.log" _package_example_run "$dir"
}

_package_run() {
    local work=$1 sdist wheel
    venv_ensure build 3.11 build || return 1
    _package_step "python -m build (sdist, then the wheel from it)" "$work/build.log" \
        _package_build "$work" || return 1
    sdist=$(echo "$work"/dist/*.tar.gz)
    wheel=$(echo "$work"/dist/*.whl)
    if [[ ! -f $sdist || ! -f $wheel ]]; then
        echo "  build made no sdist or no wheel: $(ls "$work/dist")"
        return 1
    fi
    # Wrong contents do not stop the smoke tests: both results help to find the cause.
    local rc=0
    "$VENV_ROOT/build/bin/python" scripts/package/contents.py "$PWD" "$sdist" "$wheel" || rc=1
    echo "  wheel on Python $PACKAGE_WHEEL_PYTHON:"
    if _package_smoke "$wheel" "$PACKAGE_WHEEL_PYTHON" "$work/wheel"; then
        _package_example "$work/wheel" || rc=1
    else
        rc=1
    fi
    echo "  sdist on Python $PACKAGE_SDIST_PYTHON:"
    _package_smoke "$sdist" "$PACKAGE_SDIST_PYTHON" "$work/sdist" || rc=1
    return "$rc"
}

package_check() {
    local work rc=0 start=$SECONDS
    work=$(mktemp -d)
    _package_run "$work" || rc=$?
    rm -rf "$work"
    if ((rc == 0)); then
        echo "package: OK in $((SECONDS - start)) s"
    else
        echo "package: FAILED after $((SECONDS - start)) s"
    fi
    return "$rc"
}
