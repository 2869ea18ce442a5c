"""A batch the database refuses, done again one row at a time: the rule that one bad row
(a value out of its column's range, a broken constraint) fails alone and never stops the
others. Written once here; planning, loading, claiming, recording outcomes and noting task
ids all follow it.

A connection's failure is the database's, not a row's: it is raised, and the loop retries
the whole step (with backoff, ``loop/guarding.py``).
"""

import logging
from collections.abc import Callable
from typing import TypeVar

from django_periodic.db import CONNECTION_ERRORS

logger = logging.getLogger("django_periodic")

T = TypeVar("T")


def else_one_by_one(batch: Callable[[], T], one_by_one: Callable[[], T], refused: str) -> T:
    """``batch()``; if the database refuses it, log ``refused`` with the error and return
    ``one_by_one()`` instead."""
    try:
        return batch()
    except CONNECTION_ERRORS:
        raise
    except Exception:
        logger.exception(refused)
        return one_by_one()


def refusal(call: Callable[[], T]) -> T | Exception:
    """``call()``'s result, or the error that refused this one row (a connection's failure
    is raised)."""
    try:
        return call()
    except CONNECTION_ERRORS:
        raise
    except Exception as error:
        return error
