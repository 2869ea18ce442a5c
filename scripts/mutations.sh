#!/usr/bin/env bash
# Deliberate breaks of the main promises, each shown to fail the tests that guard it:
#
#   bash scripts/mutations.sh          # every break (about 10 minutes on 2 cores)
#   bash scripts/mutations.sh 2 6b     # only these breaks, by their number
#
# Each break is one small edit of a clean copy of HEAD (git archive: the work tree and its
# uncommitted changes are never touched), made by exact text replacement: if the text is
# not found exactly once, the break is not run and the script fails, so a break can never
# pass by patching nothing. Then pytest runs the tests that guard that promise, on a
# throwaway PostgreSQL (scripts/lib/postgres.sh) with the py311-django52 virtualenv of
# scripts/test.sh. First the same tests run once on the unbroken copy: every one must pass
# there, or a failure under a break would prove nothing.
#
# A break is "caught" when at least one of its tests fails (the failures are named), and
# "MISSED" when they all pass. The output ends with a table: break, guarding tests, result.
# Exit status: 0 if every break was caught; 1 if one was missed; 2 if the tests fail on the
# unbroken copy, a break's text was not found, or a pytest run did not finish (timeout,
# collection error), or a guarding test failed unbroken twice. A test that fails unbroken
# is run again, and either way left out of the breaks (the table says so): a failure of it
# under a break would prove nothing. (The crash tests' timing bounds may fail on a loaded
# machine.) Not part of scripts/test.sh or of every CI run.
#
# Optional environment:
#   MUTATIONS_BASELINE=0     skip the run on the unbroken copy
#   MUTATIONS_TIMEOUT=900    seconds one pytest run may take before it is interrupted
#   MUTATIONS_KEEP=1         keep the copies and the pytest logs (their directory is printed)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

# shellcheck source=scripts/lib/postgres.sh
source scripts/lib/postgres.sh

VENV=$ROOT/.venv/py311-django52
PYTHON=$VENV/bin/python
TIMEOUT=${MUTATIONS_TIMEOUT:-900}

# ---------------------------------------------------------------------------------------------
# The breaks. Each has an id, a title, the edit (a function run in the copy's root) and the
# tests that guard the promise (pytest node ids, without parameters).

BREAK_IDS=(1 2 3 4 5 6a 6b 7 8a 8b)

declare -A TITLE GUARDS

# replace_once FILE OLD NEW: FILE with its one occurrence of OLD replaced by NEW; fails
# unless OLD occurs exactly once.
replace_once() {
    "$PYTHON" - "$@" <<'EOF'
import pathlib
import sys

path, old, new = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
text = path.read_text()
found = text.count(old)
if found != 1:
    sys.exit(f"mutations: {path}: expected the text below exactly once, found it {found} times:\n{old}")
path.write_text(text.replace(old, new))
EOF
}

TITLE[1]="planning twice for a plan time"
# The cursor stays: every tick plans the same plan time again. Only the ledger's unique key
# keeps a second row out, and nothing does once the first run is pruned.
# Left out: test_concurrent_planners_never_fire_a_plan_time_twice, whose planners would loop
# for ever (the schedules stay due), and test_two_schedulers_fire_every_plan_time_exactly_once,
# which passes (each plan time still gets one run while the ledger keeps them all).
GUARDS[1]="tests/test_planner.py::test_a_due_schedule_gets_one_pending_run_and_its_cursor_advances
tests/test_planner.py::test_planning_the_same_moment_twice_creates_no_second_run
tests/test_retention.py::test_pruning_all_history_never_fires_an_old_plan_time_again
tests/test_retention.py::test_pruning_a_fired_one_shots_history_never_fires_it_again
tests/test_crash.py::test_sigkilled_schedulers_lose_nothing_and_run_nothing_twice"
break_1() {
    replace_once django_periodic/engine/backends/postgresql/fires.py \
        "SET next_fire_at = c.new_cursor," \
        "SET next_fire_at = s.next_fire_at,"
}

TITLE[2]="an outcome written without its token guard"
# The run is updated whether or not its lease was released by this outcome's token.
GUARDS[2]="tests/test_leases.py::test_a_lost_lease_cannot_overwrite_a_newer_attempt
tests/test_atomic_jobs.py::test_a_lost_lease_rolls_the_writes_back_and_records_nothing
tests/test_presence.py::test_a_frozen_process_loses_its_runs_by_expiry_and_its_late_outcome_is_refused"
break_2() {
    replace_once django_periodic/engine/backends/postgresql/runs.py \
        "FROM released v CROSS JOIN t" \
        "FROM v CROSS JOIN t"
}

TITLE[3]="a whole burst marked started ahead of the threads"
# Every claim is marked started as it is claimed, not when a thread is about to call its job.
GUARDS[3]="tests/test_starts.py
tests/test_crash.py::test_a_killed_schedulers_runs_are_recovered_at_once_and_not_failed_unstarted"
break_3() {
    replace_once django_periodic/engine/runs/claims.py \
        "    return _claim_repeating(Asked(wanted, now, ahead, using), limit).claims" \
        "    claimed = _claim_repeating(Asked(wanted, now, ahead, using), limit).claims
    ledger(using).mark_started([c.token for c in claimed])
    return claimed"
}

TITLE[4]="a lease never extended"
# The heartbeat still notes the lease's heartbeat, but no longer moves its expiry.
GUARDS[4]="tests/test_leases.py::test_one_heartbeat_extends_every_lease_of_the_process_by_its_own_length
tests/test_leases.py::test_a_heartbeat_extends_only_the_leases_the_process_still_holds
tests/test_outcomes.py::test_a_run_whose_outcome_could_not_be_recorded_is_not_renewed_and_the_sweeper_settles_it"
break_4() {
    replace_once django_periodic/engine/runs/leases.py \
        "    held = ledger(using).held_to_extend(held, tokens, process.pk)
    return held.update(heartbeat_at=now, expires_at=_extended(now))" \
        "    held = ledger(using).held_to_extend(held, tokens, process.pk)
    return held.update(heartbeat_at=now)"
}

TITLE[5]="an atomic job's writes committed before its outcome"
# The job runs in a transaction of its own, which commits before its outcome's opens.
# Left out: test_crash.py::test_killed_schedulers_leave_each_atomic_plan_time_exactly_one_row.
# It also failed unbroken (its check that a fire is skipped only behind a killed run), and a
# kill rarely lands between the two commits this break makes.
GUARDS[5]="tests/test_atomic_jobs.py::test_a_lost_lease_rolls_the_writes_back_and_records_nothing
tests/test_atomic_jobs.py::test_a_frozen_atomic_jobs_late_commit_is_refused_and_leaves_nothing"
break_5() {
    replace_once django_periodic/engine/runs/atomic.py \
        "        with transaction.atomic(using=claim.using):
            outcome = outcome_of(job(), None)" \
        "        with transaction.atomic(using=claim.using):
            result = job()
        with transaction.atomic(using=claim.using):
            outcome = outcome_of(result, None)"
}

TITLE[6a]="a NOTIFY dropped: after planning"
# A pass that planned more runs than its own threads start wakes no other scheduler.
# (Every process test polls each second, tests/settings.py: none depends on this NOTIFY.)
GUARDS[6a]="tests/test_wakeups.py::test_runs_planned_beyond_what_the_planner_starts_itself_wake_the_other_schedulers"
break_6a() {
    replace_once django_periodic/engine/loop/scheduler.py \
        "            announcements.notify(self.using)  # more than we start at once: others claim too" \
        "            pass"
}

TITLE[6b]="a NOTIFY dropped: after run_now()"
# A manual run (run_now(), the admin's button) is recorded without waking the schedulers.
GUARDS[6b]="tests/test_policies.py::test_a_sleeping_scheduler_wakes_at_once_for_run_now"
break_6b() {
    replace_once django_periodic/engine/overlap.py \
        "        if any(run.status == Run.Status.PENDING for run in created):
            announcements.notify(using)" \
        "        if any(run.status == Run.Status.PENDING for run in created):
            pass"
}

TITLE[7]="an unknown job disabled at once"
# UNKNOWN_JOB_GRACE ignored: a schedule whose job no live process has is disabled when seen.
GUARDS[7]="tests/test_fleet.py::test_a_job_no_live_process_has_is_planned_then_disabled_after_the_grace
tests/test_fleet.py::test_a_rolling_deploy_that_adds_a_job_runs_it_once_the_new_release_joins"
break_7() {
    replace_once django_periodic/engine/fleet.py \
        "    disabled = [s for s in unknown if now - (s.job_unknown_since or now) >= grace]" \
        "    disabled = list(unknown)"
}

TITLE[8a]="pause_after_failures left to the alerts' pass"
# A failure's outcome no longer pauses its schedule: only the pass every ALERT_INTERVAL does.
GUARDS[8a]="tests/test_self_pausing.py::test_the_nth_failure_pauses_its_schedule_in_its_outcomes_transaction
tests/test_self_pausing.py::test_a_running_scheduler_pauses_at_the_third_failure_and_starts_no_more"
break_8a() {
    replace_once django_periodic/engine/runs/outcomes.py \
        "        _pause_reached(_streaks_to_judge(outcomes, recorded), now, using)" \
        "        pass"
}

TITLE[8b]="a pause for failures that withdraws no fire"
# The schedule pauses at the failure, but its fires planned or claimed ahead still start.
# Left out: the running scheduler's test, which passes: with overlap "skip", the next fire
# is planned only once the failing run has ended, so it is planned skipped (paused).
GUARDS[8b]="tests/test_self_pausing.py::test_runs_not_started_when_it_pauses_never_start"
break_8b() {
    replace_once django_periodic/engine/planning/self_pausing.py \
        "        withdrawn = _withdraw(paused, now, using)" \
        "        withdrawn: list[int] = []"
}

# ---------------------------------------------------------------------------------------------

WORK=
cleanup() {
    pg_stop
    if [[ -n $WORK && -d $WORK ]]; then
        if [[ ${MUTATIONS_KEEP:-0} == 1 ]]; then
            echo "mutations: copies and logs kept in $WORK"
        else
            rm -rf "$WORK"
        fi
    fi
}

banner() { printf '\n== %s ==\n' "$*"; }

elapsed() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# guards_of ID: the break's node ids, one a line.
guards_of() { printf '%s\n' "${GUARDS[$1]}"; }

# run_pytest DIR NAME NODEIDS...: pytest on the copy in DIR, its output in $WORK/NAME.log
# and its results in $WORK/NAME.xml; returns pytest's exit status (124: timed out).
run_pytest() {
    local dir=$1 name=$2 rc=0
    shift 2
    (
        cd "$dir"
        # The copy's package and tests, not the work tree's (the virtualenv's editable
        # install points there); children of the tests get the copy too (tests/processes.py).
        export PYTHONPATH=$dir VIRTUAL_ENV=$VENV PATH=$VENV/bin:$PATH
        export PERIODIC_TEST_DB=postgres PERIODIC_TEST_POSTGRES_URL PG_DIR PG_BINDIR
        timeout -s INT -k 60 "$TIMEOUT" "$PYTHON" -m pytest -p no:cacheprovider -q -rfE \
            --basetemp "$WORK/pytest-$name" --junitxml "$WORK/$name.xml" "$@"
    ) >"$WORK/$name.log" 2>&1 || rc=$?
    return "$rc"
}

# outcomes NAME NODEIDS...: "OUTCOME TEST" a line for each node id (for a file's, each of its
# tests), from $WORK/NAME.xml: FAILED or ERROR if any of its cases did, else passed if any
# passed, else skipped (or not run). A parametrized test's cases count as its own.
outcomes() {
    local name=$1
    shift
    "$PYTHON" - "$WORK/$name.xml" "$@" <<'EOF'
import sys
import xml.etree.ElementTree as ET

path, wanted = sys.argv[1], sys.argv[2:]
try:
    cases = list(ET.parse(path).getroot().iter("testcase"))
except (OSError, ET.ParseError):
    cases = []


def node(case):
    module, name = case.get("classname", ""), case.get("name", "")
    return module.replace(".", "/") + ".py::" + name


def outcome(case):
    tags = {child.tag for child in case}
    if "failure" in tags:
        return "FAILED"
    if "error" in tags:
        return "ERROR"
    return "skipped" if "skipped" in tags else "passed"


for guard in wanted:
    mine = [c for c in cases if node(c) == guard or node(c).startswith((guard + "[", guard + "::"))]
    if "::" in guard or not mine:
        groups = {guard: mine}
    else:  # a file: each of its tests
        groups = {}
        for case in mine:
            groups.setdefault(node(case).split("[")[0], []).append(case)
    for test, its in groups.items():
        verdicts = {outcome(c) for c in its}
        for verdict in ("FAILED", "ERROR", "passed", "skipped"):
            if verdict in verdicts:
                break
        else:
            verdict = "not run"
        print(verdict, test)
EOF
}

# failures NAME: each failed test of $WORK/NAME.xml with the first line of its message.
failures() {
    "$PYTHON" - "$WORK/$1.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET

try:
    cases = list(ET.parse(sys.argv[1]).getroot().iter("testcase"))
except (OSError, ET.ParseError):
    cases = []
for case in cases:
    for child in case:
        if child.tag in ("failure", "error"):
            message = (child.get("message") or "").strip().splitlines() or [""]
            test = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
            verdict = "FAILED" if child.tag == "failure" else "ERROR"
            print(f"{verdict} {test}\n    {message[0][:200]}")
EOF
}

declare -A RESULT DETAIL
# Tests that did not pass unbroken, left out of the breaks: those that passed when run again
# (FLAKY), and those that failed again (BROKEN: the script then ends with status 2).
FLAKY=()
BROKEN=()
DESELECT=()

# why_left_out TEST: why TEST is left out of the breaks (nothing: it is not).
why_left_out() {
    if [[ " ${FLAKY[*]} " == *" $1 "* ]]; then echo "failed unbroken, passed when run again"; fi
    if [[ " ${BROKEN[*]} " == *" $1 "* ]]; then echo "failed unbroken, twice"; fi
}

# left_out: outcomes' lines, those of the tests left out said so.
left_out() {
    local line test
    while IFS= read -r line; do
        for test in "${FLAKY[@]}" "${BROKEN[@]}"; do
            if [[ $line == *" $test" ]]; then line="left out $test ($(why_left_out "$test"))"; fi
        done
        echo "$line"
    done
}

run_break() {
    local id=$1
    local dir=$WORK/break-$id started rc=0 test guard
    local -a guards
    mapfile -t guards < <(guards_of "$id")
    banner "break $id: ${TITLE[$id]}"
    cp -a "$WORK/clean" "$dir"
    (cd "$dir" && "break_$id") || {
        RESULT[$id]="ERROR"
        DETAIL[$id]="its text was not found: the code moved; update the break"
        return 0
    }
    diff -ru -U1 -x __pycache__ "$WORK/clean" "$dir" | sed "s|$WORK/||; s/^/    /" || true
    if ! "$PYTHON" -m compileall -q "$dir/django_periodic" >/dev/null; then
        RESULT[$id]="ERROR"
        DETAIL[$id]="the broken code does not compile: update the break"
        return 0
    fi
    started=$SECONDS
    run_pytest "$dir" "break-$id" "${guards[@]}" "${DESELECT[@]}" || rc=$?
    DETAIL[$id]=$(outcomes "break-$id" "${guards[@]}" | left_out)
    for test in "${FLAKY[@]}" "${BROKEN[@]}"; do # a file's tests: the outcomes do not list them
        for guard in "${guards[@]}"; do
            if [[ $guard != *::* && $test == "$guard::"* ]]; then
                DETAIL[$id]+=$'\n'"left out $test ($(why_left_out "$test"))"
            fi
        done
    done
    if ((rc == 0)); then
        RESULT[$id]="MISSED"
    elif ((rc == 1)) && grep -qE '^(FAILED|ERROR) ' <<<"${DETAIL[$id]}"; then
        RESULT[$id]="caught"
    elif ((rc == 124)); then
        RESULT[$id]="ERROR"
        DETAIL[$id]+=$'\n'"(interrupted after ${TIMEOUT} s; see its log)"
    else
        RESULT[$id]="ERROR"
        DETAIL[$id]+=$'\n'"(pytest exited $rc: not a test failure; see its log)"
    fi
    failures "break-$id"
    if [[ ${RESULT[$id]} == ERROR ]]; then tail -n 30 "$WORK/break-$id.log"; fi
    printf '%s: %s in %s\n' "break $id" "${RESULT[$id]}" "$(elapsed $((SECONDS - started)))"
    rm -rf "$dir" "$WORK/pytest-break-$id"
}

summarize() {
    local id first line
    banner "summary: run time $(elapsed "$SECONDS")"
    printf '%-4s %-52s %-7s %s\n' "" "break" "result" "guarding tests (their outcome under the break)"
    for id in "${SELECTED[@]}"; do
        first=1
        while IFS= read -r line; do
            [[ -n $line ]] || continue
            if ((first)); then
                printf '%-4s %-52s %-7s %s\n' "$id" "${TITLE[$id]}" "${RESULT[$id]}" "$line"
                first=0
            else
                printf '%-4s %-52s %-7s %s\n' "" "" "" "$line"
            fi
        done <<<"${DETAIL[$id]}"
    done
    local missed=0 errors=0
    for id in "${SELECTED[@]}"; do
        case ${RESULT[$id]} in
            MISSED) missed=$((missed + 1)) ;;
            caught) ;;
            *) errors=$((errors + 1)) ;;
        esac
    done
    echo "${#SELECTED[@]} breaks: $((${#SELECTED[@]} - missed - errors)) caught, $missed missed, $errors not run to the end"
    if ((${#BROKEN[@]})); then
        echo "${#BROKEN[@]} guarding tests failed unbroken twice and were left out: ${BROKEN[*]}"
    fi
    if ((errors || ${#BROKEN[@]})); then return 2; fi
    if ((missed)); then return 1; fi
    return 0
}

main() {
    local id
    SELECTED=()
    if (($#)); then
        for id in "$@"; do
            [[ -n ${TITLE[$id]:-} ]] || { echo "mutations: no break $id (breaks: ${BREAK_IDS[*]})" >&2; exit 2; }
            SELECTED+=("$id")
        done
    else
        SELECTED=("${BREAK_IDS[@]}")
    fi
    if [[ ! -x $PYTHON ]]; then
        echo "mutations: $VENV is missing: run scripts/test.sh once (PERIODIC_TEST_ENVS=py311-django52 narrows it)" >&2
        exit 2
    fi

    trap 'exit 130' INT
    trap 'exit 143' TERM
    trap cleanup EXIT
    WORK=$(mktemp -d /tmp/periodic-mutations.XXXXXX)
    mkdir "$WORK/clean"
    git archive --format=tar HEAD | tar -x -C "$WORK/clean"
    echo "mutations: a clean copy of HEAD ($(git rev-parse --short HEAD)) in $WORK/clean"
    local found
    found=$(cd "$WORK/clean" && PYTHONPATH=$WORK/clean "$PYTHON" -c \
        'import django_periodic, tests; print(django_periodic.__file__, tests.__file__)')
    if [[ $found != "$WORK/clean/"*" $WORK/clean/"* ]]; then
        echo "mutations: the copy's code is not the one imported ($found)" >&2
        exit 2
    fi

    pg_start
    PERIODIC_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$PG_PORT/$PG_DB_NAME"

    local -a every=()
    for id in "${SELECTED[@]}"; do mapfile -t -O "${#every[@]}" every < <(guards_of "$id"); done
    mapfile -t every < <(printf '%s\n' "${every[@]}" | sort -u)

    if [[ ${MUTATIONS_BASELINE:-1} != 0 ]]; then
        banner "the guarding tests on the unbroken copy"
        local rc=0 started=$SECONDS unbroken test
        local -a again
        run_pytest "$WORK/clean" baseline "${every[@]}" || rc=$?
        unbroken=$(outcomes baseline "${every[@]}")
        echo "$unbroken"
        echo "($(elapsed $((SECONDS - started))))"
        if ((rc != 0)) || grep -qv '^passed ' <<<"$unbroken"; then
            failures baseline
            mapfile -t again < <(grep -v '^passed ' <<<"$unbroken" | sed -E 's/^(not run|[A-Za-z]+) //')
            banner "those that did not pass unbroken, once more"
            run_pytest "$WORK/clean" baseline-again "${again[@]}" || true
            unbroken=$(outcomes baseline-again "${again[@]}")
            echo "$unbroken"
            failures baseline-again
            for test in "${again[@]}"; do
                if grep -qxF "passed $test" <<<"$unbroken"; then
                    FLAKY+=("$test")
                else
                    BROKEN+=("$test")
                fi
                DESELECT+=(--deselect "$test")
            done
            echo "mutations: left out of the breaks, as passing only when run again: ${FLAKY[*]:-none};" \
                "as failing twice: ${BROKEN[*]:-none}"
        fi
        rm -rf "$WORK/pytest-baseline" "$WORK/pytest-baseline-again"
    fi

    for id in "${SELECTED[@]}"; do run_break "$id"; done
    summarize
}

main "$@"
