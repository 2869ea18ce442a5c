"""Stagger: a run starts at its plan time plus a fixed offset in [0, jitter).

The offset comes from the run's schedule, scope and plan time alone, so every process,
the admin's preview and a test compute the same one; the ledger key stays the plan time.
A hash spreads the runs of many schedules, or of one schedule's many scopes, evenly over
the jitter.
"""

import hashlib
from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_HASH_BITS = 64


def offset(
    jitter: timedelta | None, schedule_id: int, scope: str, plan_time: datetime
) -> timedelta:
    """The stagger of the run of ``schedule_id`` for ``scope`` at ``plan_time``: a share
    of ``jitter`` (none for an empty or zero jitter), whole microseconds."""
    if not jitter:
        return timedelta(0)
    microseconds = (plan_time - _EPOCH) // _MICROSECOND
    key = f"{schedule_id}\x1f{scope}\x1f{microseconds}".encode()
    share = int.from_bytes(hashlib.blake2b(key, digest_size=_HASH_BITS // 8).digest())
    return (jitter // _MICROSECOND * share >> _HASH_BITS) * _MICROSECOND


def release_time(
    jitter: timedelta | None, schedule_id: int, scope: str, plan_time: datetime
) -> datetime | None:
    """When that run may start (``Run.release_at``); None for a run not staggered, which
    starts at its plan time."""
    if not jitter:
        return None
    return plan_time + offset(jitter, schedule_id, scope, plan_time)
