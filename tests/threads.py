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
