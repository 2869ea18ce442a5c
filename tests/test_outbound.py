"""The outbound sender: calls made by its own thread, in order, once, never blocking the
poster; a call that hangs fills the queue, and what overflows is dropped and counted."""

import logging
import threading

from django_periodic.operations.outbound import Sender


def test_calls_are_made_in_order_by_another_thread():
    made = []
    sender = Sender("test calls")
    for n in range(5):
        assert sender.post(lambda n=n: made.append((n, threading.current_thread().name)))
    assert sender.flush(5)
    assert [n for n, _ in made] == [0, 1, 2, 3, 4]
    assert {name for _, name in made} == {"django_periodic.test calls"}


def test_a_call_that_raises_is_logged_once_and_the_next_still_made(caplog):
    made = []
    sender = Sender("test raising")

    def broken():
        raise OSError("refused")

    with caplog.at_level(logging.ERROR, logger="django_periodic"):
        sender.post(broken)
        sender.post(lambda: made.append(1))
        assert sender.flush(5)
    assert made == [1]
    failures = [r for r in caplog.records if "could not be sent" in r.getMessage()]
    assert len(failures) == 1  # not retried


def test_a_hanging_call_never_blocks_the_poster_and_overflow_is_counted(caplog):
    hung, released = threading.Event(), threading.Event()
    made = []

    def hang():
        hung.set()
        released.wait(10)

    sender = Sender("test hanging", size=3)
    with caplog.at_level(logging.WARNING, logger="django_periodic"):
        sender.post(hang)
        assert hung.wait(5)  # taken off the queue: three may wait behind it
        accepted = [sender.post(lambda n=n: made.append(n)) for n in range(5)]
        assert accepted == [True, True, True, False, False]
        assert not sender.flush(0.05)  # still hanging
        released.set()
        assert sender.flush(5)
    assert made == [0, 1, 2]
    messages = [r.getMessage() for r in caplog.records]
    assert any("2 were dropped" in m for m in messages)


def test_an_attempts_id_is_the_same_for_the_same_attempt_and_only_for_it():
    from django_periodic.operations.outbound import attempt_id

    assert attempt_id(7, 1) == attempt_id(7, 1)
    ids = {attempt_id(run, attempt) for run in (7, 8, 71) for attempt in (1, 2, 11)}
    assert len(ids) == 9  # "7.11" and "71.1" are told apart
