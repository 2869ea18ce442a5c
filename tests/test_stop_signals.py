import os
import signal

from django_periodic.engine.loop.stop_signals import StopSignals, starting_scheduler


def test_a_stop_signal_is_counted_and_rings_the_alarm():
    signals = StopSignals()
    previous = signal.getsignal(signal.SIGTERM)
    signals.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.requested and not signals.hurried
        assert signals.alarm.wait(0)
        os.kill(os.getpid(), signal.SIGINT)
        assert signals.hurried
    finally:
        signals.uninstall()
    assert signal.getsignal(signal.SIGTERM) is previous


def test_the_handler_takes_no_lock_so_it_can_interrupt_anything():
    # The handler runs on the main thread between two bytecodes, wherever that thread is:
    # had it taken a lock (threading.Event.set does), one held there would deadlock it.
    signals = StopSignals()
    signals.install()
    try:
        for _ in range(10_000):  # far more than the pipe holds: a full pipe must not block
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        signals.uninstall()
    assert signals.received == 10_000
    assert signals.alarm.wait(0) and not signals.alarm.wait(0)


def test_only_run_scheduler_installs_the_handlers_while_apps_load():
    assert starting_scheduler(["manage.py", "run_scheduler", "--workers", "2"])
    assert not starting_scheduler(["manage.py", "runserver"])
    assert not starting_scheduler(["gunicorn"])
