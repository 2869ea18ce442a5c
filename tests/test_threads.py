"""The tests' own thread: what its target raises fails the test."""

import pytest

from tests.threads import Thread


def test_join_raises_what_the_target_raised():
    thread = Thread(target=lambda: 1 / 0)
    thread.start()
    with pytest.raises(ZeroDivisionError):
        thread.join()
    thread.join()  # raised once: a second join has nothing to say


def test_join_returns_when_the_target_did_not_raise():
    done = []
    thread = Thread(target=done.append, args=(True,))
    thread.start()
    thread.join()
    assert done == [True]
