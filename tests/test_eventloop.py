"""The event loop of async jobs, on its own: no database, no scheduler."""

import asyncio
import threading

import pytest

from django_periodic.engine.loop import eventloop
from django_periodic.engine.loop.eventloop import EventLoop, EventLoopStopped
from tests.threads import Thread


@pytest.fixture
def loop():
    started = EventLoop()
    yield started
    started.stop()
    assert started.join(timeout=10)


async def where() -> tuple[str, int]:
    """Which thread and event loop awaited this."""
    return threading.current_thread().name, id(asyncio.get_running_loop())


def test_coroutines_from_any_thread_are_awaited_on_the_one_loop_thread(loop):
    seen: list[tuple[str, int]] = []

    def submit() -> None:
        seen.append(loop.submit(where()).result(timeout=10))

    threads = [Thread(target=submit) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(seen) == {("periodic-event-loop", id(loop.loop))}


def test_coroutines_await_side_by_side(loop):
    count, arrived, everyone_here = 50, [], asyncio.Event()

    async def meet() -> int:
        arrived.append(1)
        if len(arrived) == count:
            everyone_here.set()
        # None leaves before all have come: only a loop awaiting all 50 at once gets here.
        await asyncio.wait_for(everyone_here.wait(), timeout=10)
        return len(arrived)

    futures = [loop.submit(meet()) for _ in range(count)]
    assert [future.result(timeout=20) for future in futures] == [count] * count


@pytest.mark.parametrize("name", ["SystemExit", "KeyboardInterrupt"])
def test_the_loop_carries_on_when_a_callback_breaks_out_of_it(loop, name):
    exception = {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}[name]

    def break_out() -> None:
        raise exception("from a callback")

    async def job() -> str:
        asyncio.get_running_loop().call_soon(break_out)
        await asyncio.sleep(0.05)
        return "carried on"

    assert loop.submit(job()).result(timeout=10) == "carried on"
    assert loop.submit(where()).result(timeout=10)[1] == id(loop.loop)


def test_the_loop_carries_on_when_a_job_stops_it(loop):
    async def job() -> str:
        asyncio.get_running_loop().stop()
        await asyncio.sleep(0.05)
        return "carried on"

    assert loop.submit(job()).result(timeout=10) == "carried on"
    assert loop.accepting()


def test_a_stopped_loop_ends_once_its_coroutines_are_done_and_takes_no_more(loop):
    gate = asyncio.Event()

    async def wait_at_the_gate() -> str:
        await gate.wait()
        return "through"

    waiting = loop.submit(wait_at_the_gate())
    loop.stop()
    assert not loop.accepting()
    with pytest.raises(EventLoopStopped):
        loop.submit(where())
    assert not loop.join(timeout=0.2)  # still awaiting its coroutine
    loop.loop.call_soon_threadsafe(gate.set)
    assert waiting.result(timeout=10) == "through"
    assert loop.join(timeout=10)


def test_the_process_loop_starts_on_first_use_and_again_after_a_stop():
    eventloop.stop()
    assert eventloop.current() is None
    first = eventloop.submit(where()).result(timeout=10)
    running = eventloop.current()
    assert running is not None and first[1] == id(running.loop)
    assert eventloop.submit(where()).result(timeout=10) == first  # the same loop again
    eventloop.stop()
    assert eventloop.current() is None
    assert running.join(timeout=10)
    assert eventloop.submit(where()).result(timeout=10)[0] == "periodic-event-loop"
    assert eventloop.current() is not running
    eventloop.stop()
