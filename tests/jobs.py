"""Jobs the tests schedule. Autodiscovered, as any installed app's jobs.py is."""

import asyncio
import os
import threading
import time

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from django_periodic import job, scopes
from tests.models import Execution

# A scheduler that is slow to load its jobs: tests stop it while it is still starting.
if slow_import := float(os.environ.get("PERIODIC_TEST_SLOW_IMPORT", 0)):
    print("tests.jobs: loading slowly", flush=True)
    time.sleep(slow_import)


@job
def noop(*args, **kwargs):
    """Does nothing and returns its arguments."""
    return {"args": list(args), "kwargs": kwargs}


@job
def add(a: int, b: int) -> int:
    """Adds two numbers."""
    return a + b


@job
def explode(message: str = "boom"):
    """Always raises."""
    raise RuntimeError(message)


@job(takes_context=True)
def record(context, seconds: float = 0.0, notes: str = ""):
    """Writes an Execution row for its run, after sleeping ``seconds``; with ``notes``, a
    file, first notes its call there (``note``)."""
    if notes:
        note(context, notes)
    if seconds:
        time.sleep(seconds)
    Execution.objects.create(
        schedule=context.run.schedule.name,
        plan_time=context.plan_time,
        attempt=context.attempt,
        pid=os.getpid(),
    )
    return context.attempt


@job(takes_context=True)
def report_context(context):
    """Returns what its context says."""
    return {
        "run": context.run.pk,
        "plan_time": context.plan_time.isoformat(),
        "attempt": context.attempt,
        "heartbeat": context.heartbeat(),
        "cancelled": context.cancelled,
    }


def note(context, notes: str) -> None:
    """Appends a line for this call to the file ``notes``, durably, before the job does
    anything else: "<run> <attempt> <pid> <epoch seconds> <schedule> <plan time>".

    The crash tests' record of what was called, kept outside the ledger: one write (lines
    of processes appending at once never interleave), on disk before it returns, so it
    outlives a SIGKILL of its process and a restart of the database alike.
    """
    run = context.run
    line = (
        f"{run.pk} {context.attempt} {os.getpid()} {time.time():.6f}"
        f" {run.schedule.name} {context.plan_time.isoformat()}\n"
    )
    fd = os.open(notes, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@job(takes_context=True)
def linger(context, seconds: float = 30.0, cooperative: bool = True):
    """Writes an Execution row, then waits ``seconds`` (less if cancelled and cooperative)."""
    Execution.objects.create(
        schedule=context.run.schedule.name,
        plan_time=context.plan_time,
        attempt=context.attempt,
        pid=os.getpid(),
    )
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cooperative and context.cancelled:
            return "stopped"
        time.sleep(0.05)
    return "finished"


@job
async def add_later(a: int, b: int) -> int:
    """Adds two numbers after yielding to the event loop once."""
    await asyncio.sleep(0)
    return a + b


@job(takes_context=True)
async def report_context_async(context):
    """Returns what its context says, heartbeating both ways from the event loop."""
    return {
        "heartbeat": context.heartbeat(),
        "aheartbeat": await context.aheartbeat(),
        "cancelled": context.cancelled,
    }


@job(takes_context=True)
async def linger_async(context, seconds: float = 30.0):
    """Writes an Execution row, then awaits ``seconds`` (cut short by a stop request)."""
    await Execution.objects.acreate(
        schedule=context.run.schedule.name,  # loaded with the claim: no query here
        plan_time=context.plan_time,
        attempt=context.attempt,
        pid=os.getpid(),
    )
    await asyncio.sleep(seconds)
    return "finished"


@job
async def nap(seconds: float = 0.0):
    """Awaits ``seconds``; says which event loop and thread it was awaited on."""
    await asyncio.sleep(seconds)
    return {"loop": id(asyncio.get_running_loop()), "thread": threading.current_thread().name}


# How many runs of each group have arrived in meet(), in this process.
_arrived: dict[str, int] = {}


@job
async def meet(group: str, size: int, timeout: float = 30.0) -> int:
    """Awaits until ``size`` runs of ``group`` have arrived, so all of them must be awaited
    side by side; raises TimeoutError after ``timeout`` seconds otherwise."""
    _arrived[group] = _arrived.get(group, 0) + 1
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while _arrived[group] < size:
        if loop.time() > deadline:
            raise TimeoutError(f"{_arrived[group]} of {size} runs of {group!r} arrived")
        await asyncio.sleep(0.01)
    return size


@job
async def add_at_once(a: int, b: int) -> int:
    """Adds two numbers without ever awaiting."""
    return a + b


@job
async def explode_later(message: str = "boom"):
    """Raises after yielding to the event loop once."""
    await asyncio.sleep(0)
    raise RuntimeError(message)


@job
async def raise_base_exception_async(name: str = "SystemExit"):
    """``raise_base_exception``, from a coroutine: asyncio lets these out of its loop."""
    await asyncio.sleep(0)
    raise_base_exception(name)


@job
async def break_out_of_the_loop(name: str = "SystemExit"):
    """Has a callback of its own raise ``name`` out of the event loop, then finishes."""
    asyncio.get_running_loop().call_soon(raise_base_exception, name)
    await asyncio.sleep(0.05)
    return "carried on"


@job(takes_context=True)
async def block_the_loop(context, seconds: float = 1.0):
    """Writes an Execution row, then blocks its event loop for ``seconds`` (a sync sleep)."""
    await Execution.objects.acreate(
        schedule=context.run.schedule.name,
        plan_time=context.plan_time,
        attempt=context.attempt,
        pid=os.getpid(),
    )
    time.sleep(seconds)
    return "unblocked"


@job
def raise_base_exception(name: str = "SystemExit"):
    """Raises SystemExit, KeyboardInterrupt or GeneratorExit, which are not Exceptions."""
    raise {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}.get(
        name, GeneratorExit
    )(f"{name} from a job")


# Fan-out: the scope keys the provider "tenants" returns, and how it was called. A test sets
# TENANTS (monkeypatch) to what the provider should return, an exception to raise, or a
# function to call instead.
TENANTS: list | tuple | object = ["acme", "globex", 7]
PROVIDER_CALLS: list[bool] = []  # one per call: whether it ran inside a transaction


@scopes.provider
def tenants():
    """The tenants of the tests (TENANTS)."""
    PROVIDER_CALLS.append(connection.in_atomic_block)
    if isinstance(TENANTS, Exception):
        raise TENANTS
    return TENANTS() if callable(TENANTS) else TENANTS


@scopes.provider(name="tests.regions")
def regions():
    """Two regions."""
    return ["eu", "us"]


@scopes.provider(name="tests.fifty")
def fifty():
    """Fifty scope keys."""
    return [f"k{n:02}" for n in range(50)]


@job(takes_context=True)
def per_tenant(context, greeting: str = "hello"):
    """Returns its scope key."""
    return f"{greeting} {context.scope}"


# Results no database stores as they are, by name (tests.test_outcomes).
UNSTORABLE_RESULTS = {
    "nan": {"value": float("nan")},
    "infinities": [float("inf"), {"low": float("-inf")}],
    "nul": {"key\x00": ["value\x00", {"deeper\x00": "\x00"}]},
    "surrogate": "file \udcff.txt",
    "huge": "x" * 100_000,
    "not_json": {"when": time},  # a module
}


@job
def return_unstorable(kind: str):
    """Returns ``UNSTORABLE_RESULTS[kind]``."""
    return UNSTORABLE_RESULTS[kind]


@job
def raise_unstorable():
    """Raises with a NUL and a lone surrogate (an undecodable file name) in its message."""
    raise ValueError("bad byte \x00 in file \udcff.txt")


# A job only the "new release" has: a scheduler started with PERIODIC_TEST_OLD_RELEASE=1
# plays a process of the release before it, whose code does not register it (test_fleet).
if not os.environ.get("PERIODIC_TEST_OLD_RELEASE"):

    @job(name="tests.jobs.added_in_new_release", takes_context=True)
    def added_in_new_release(context):
        """Writes an Execution row for its run (as ``record``)."""
        Execution.objects.create(
            schedule=context.run.schedule.name,
            plan_time=context.plan_time,
            attempt=context.attempt,
            pid=os.getpid(),
        )


def _execution(context, schedule: str = "") -> Execution:
    return Execution.objects.create(
        schedule=schedule or context.run.schedule.name,
        plan_time=context.plan_time,
        attempt=context.attempt,
        pid=os.getpid(),
    )


@job(takes_context=True, atomic=True)
def atomic_record(
    context,
    seconds: float = 0.0,
    first_waits: float = 0.0,
    fail_first: bool = False,
    notes: str = "",
):
    """Atomic: writes an Execution row, then waits ``seconds``; its first attempt then waits
    ``first_waits`` more and, with ``fail_first``, raises. With ``notes``, a file, first
    notes its call there (``note``: a note is no database write, so it stays whatever
    becomes of the transaction)."""
    if notes:
        note(context, notes)
    _execution(context)
    if seconds:
        time.sleep(seconds)
    if first_waits and context.attempt == 1:
        print(f"atomic_record: run {context.run.pk} waits", flush=True)  # for a test to see
        time.sleep(first_waits)
    if fail_first and context.attempt == 1:
        raise RuntimeError("first attempt fails after writing")
    return context.attempt


def picked(plan_time, every: int, at: list[int]) -> bool:
    """Whether ``plan_time`` is one of those picked by its epoch second: that second modulo
    ``every`` is in ``at`` (a job's choice, and its test's, made the same way)."""
    return every > 0 and int(plan_time.timestamp()) % every in at


@job(takes_context=True, atomic=True)
def atomic_by_plan_time(
    context, every: int = 0, fail_at: list = (), late_at: list = (), late_seconds: float = 0.0
):
    """Atomic: writes an Execution row, committed with its run's success. For the plan times
    ``picked`` by ``fail_at`` it then raises (the row rolls back: a failure leaves none); for
    those picked by ``late_at`` it first waits ``late_seconds``."""
    if picked(context.plan_time, every, list(late_at)):
        time.sleep(late_seconds)
    _execution(context)
    if picked(context.plan_time, every, list(fail_at)):
        raise RuntimeError("fails for this plan time")
    return context.attempt


@job(takes_context=True, atomic=True)
def atomic_with_hook(context, fail: bool = False):
    """Atomic: writes a row, and asks for another at commit (``on_commit``)."""
    _execution(context)
    transaction.on_commit(lambda: _execution(context, schedule="on_commit hook"))
    if fail:
        raise RuntimeError("fails after writing")


@job(takes_context=True, atomic=True)
def atomic_durable(context):
    """Atomic, but opens a durable block of its own: it cannot."""
    with transaction.atomic(durable=True):
        _execution(context)


@job(takes_context=True, atomic=True)
def atomic_swallows_an_error(context):
    """Atomic, but catches a database error without a savepoint: its transaction is spoiled
    (PostgreSQL)."""
    _execution(context)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
    except DatabaseError:
        pass


@job(takes_context=True, atomic=True)
def atomic_loses_its_lease(context):
    """Atomic: writes a row, then its lease is released by another connection (as another
    process's sweeper would) before it returns."""
    _execution(context)
    released = threading.Thread(target=_release_leases_of, args=(context.run.pk,))
    released.start()
    released.join()


def _release_leases_of(run_id: int) -> None:
    from django.db import connections

    from django_periodic.models import Lease

    try:
        Lease.objects.filter(run_id=run_id).held().release(timezone.now(), Lease.Outcome.EXPIRED)
    finally:
        connections.close_all()


@job(takes_context=True, atomic=True)
def atomic_heartbeat(context):
    """Atomic: returns what ``context.heartbeat()`` says."""
    return context.heartbeat()


@job(takes_context=True)
def record_and_fail(context):
    """Writes an Execution row for its run (committed: it is not atomic), then raises."""
    record(context)
    raise RuntimeError("recorded, then failed")


@job
def open_a_span(name: str = "inside the job"):
    """Opens an OpenTelemetry span of its own, as an instrumented library would."""
    from opentelemetry import trace

    with trace.get_tracer("tests").start_as_current_span(name):
        return name


@job(takes_context=True)
def work_until_stopped(context, notes: str, seconds: float = 60.0):
    """Loops for ``seconds``, checking its cancel token, and appends how it ended to the file
    ``notes`` ("<run> started", then "<run> stopped" or "<run> finished"): a record kept
    outside the ledger of what the job itself saw."""
    run = context.run.pk

    def write(line: str) -> None:
        with open(notes, "a") as file:
            file.write(f"{run} {line}\n")

    write("started")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if context.cancelled:
            write("stopped")
            return "stopped"
        time.sleep(0.05)
    write("finished")
    return "finished"


@job(takes_context=True)
def occupy(context, notes: str, seconds: float = 0.3):
    """Notes "start" then, ``seconds`` later, "end" for its run in the file ``notes``, with
    its process, its scope key and the wall-clock time of each: the concurrency tests'
    record of when jobs really ran."""
    # "<start|end> <run> <pid> <scope, or -> <epoch seconds>"
    where = f"{context.run.pk} {os.getpid()} {context.scope or '-'}"
    _note_line(notes, f"start {where} {time.time():.6f}\n")
    time.sleep(seconds)
    _note_line(notes, f"end {where} {time.time():.6f}\n")


def _note_line(notes: str, line: str) -> None:
    fd = os.open(notes, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
