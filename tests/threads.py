"""Threads for tests: what a thread's target raises fails the test that joins it."""

import threading
from typing import Any

from django.db import connections


class Thread(threading.Thread):
    """A ``threading.Thread`` whose ``join()`` re-raises what its target raised (a plain
    thread only prints it, and the test goes on as if nothing happened). Its own database
    connections are closed when its target ends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            super().run()
        except BaseException as error:
            self.error = error
        finally:
            connections.close_all()

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def save_together(model: Any, pk: int, edits: dict[str, dict[str, Any]]) -> None:
    """Each edit (who makes it: the fields it sets) loads the row ``pk`` of ``model`` in a
    thread of its own, with its own connection; once all have loaded it, all save at once,
    each as its own ``changed_by``. What a save raises fails the caller."""
    from django_periodic.models import changed_by

    loaded_all = threading.Barrier(len(edits))

    def edit(by: str, fields: dict[str, Any]) -> None:
        loaded = model.objects.get(pk=pk)
        loaded_all.wait(10)
        for name, value in fields.items():
            setattr(loaded, name, value)
        with changed_by(by):
            loaded.save()

    threads = [Thread(target=edit, args=edit_) for edit_ in edits.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
