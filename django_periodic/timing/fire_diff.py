"""A diff of two lists of fires: which are added, removed, or moved (``diff``), each with
flags that say why it stands out (a DST change, a calendar).

Pure: no models, no database; ``Schedule.fire_diff()`` (models/explaining/fire_diff.py)
feeds it the fires of a schedule as it is and as a change would make it.

**Moved.** A removed fire and an added fire are one moved fire when they fall on the same
local day, each in its own side's time zone (the schedule's before and after the change),
and are that day's fires of the same rank, each in its own list (its first, its second,
...). So "09:00" edited to "10:00" moves each day's fire; "09:00" edited to "09:00,17:00"
adds the 17:00 fires; an hourly trigger edited to every two hours removes the odd hours; a
time zone edit moves each day's fire to the same wall time of that day in the new zone. Any
other fire not in both lists is added or removed.
"""

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, tzinfo
from typing import Any

# The flags a fire may carry (its side's: the schedule as it is for a removed fire, as
# changed for an added one).
DST_GAP = "dst_gap"  # runs for a wall time a spring-forward change skips
DST_REPEAT = "dst_repeat"  # runs for a wall time a fall-back change repeats
CLOSED = "closed"  # a removed fire the changed schedule's calendars close
SHIFTED = "shifted"  # run on another day than its trigger's, by its calendars
OVERRIDDEN = "overridden"  # skipped or moved by a single-fire override


@dataclass(frozen=True)
class DiffFire:
    """A fire of a diff: when, aware UTC, and its flags."""

    at: datetime
    flags: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"at": self.at.isoformat(), "flags": list(self.flags)}


@dataclass(frozen=True)
class MovedFire:
    """A fire that runs at another time of its day: ``old`` before the change, ``new`` after."""

    old: DiffFire
    new: DiffFire

    def as_dict(self) -> dict[str, Any]:
        return {"old": self.old.as_dict(), "new": self.new.as_dict()}


@dataclass(frozen=True)
class FireDiff:
    """What a change does to the fires of ``[since, until)``; false when nothing changes."""

    since: datetime
    until: datetime
    added: tuple[DiffFire, ...] = ()
    removed: tuple[DiffFire, ...] = ()
    moved: tuple[MovedFire, ...] = ()
    kept: int = 0  # the fires in both

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.moved)

    def as_dict(self) -> dict[str, Any]:
        """The diff as JSON values (times in ISO 8601, UTC)."""
        return {
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "added": [fire.as_dict() for fire in self.added],
            "removed": [fire.as_dict() for fire in self.removed],
            "moved": [fire.as_dict() for fire in self.moved],
            "kept": self.kept,
        }


def diff(
    old: Sequence[datetime],
    new: Sequence[datetime],
    zones: tuple[tzinfo, tzinfo],
    flags: Mapping[datetime, tuple[str, ...]],
    *,
    since: datetime,
    until: datetime,
) -> FireDiff:
    """The fires of ``new`` not in ``old`` (added), of ``old`` not in ``new`` (removed), and
    the pairs of them that are one fire moved within its local day (the rule above), in the
    old and the new time zone (``zones``). ``flags`` gives each fire's flags, by its time."""
    kept = set(old) & set(new)
    gone = [fire for fire in old if fire not in kept]
    came = [fire for fire in new if fire not in kept]
    old_rank, new_rank = _ranks(old, zones[0]), _ranks(new, zones[1])
    by_rank = {old_rank[fire]: fire for fire in gone}
    moved, added = [], []
    for fire in came:
        partner = by_rank.pop(new_rank[fire], None)
        if partner is None:
            added.append(_flagged(fire, flags))
        else:
            moved.append(MovedFire(_flagged(partner, flags), _flagged(fire, flags)))
    left = set(by_rank.values())
    removed = [_flagged(fire, flags) for fire in gone if fire in left]
    return FireDiff(since, until, tuple(added), tuple(removed), tuple(moved), len(kept))


def _ranks(fires: Sequence[datetime], zone: tzinfo) -> dict[datetime, tuple[date, int]]:
    """Each fire's local day in ``zone`` and its rank among that day's fires."""
    counts: dict[date, int] = defaultdict(int)
    ranks = {}
    for fire in sorted(fires):
        day = fire.astimezone(zone).date()
        ranks[fire] = (day, counts[day])
        counts[day] += 1
    return ranks


def _flagged(fire: datetime, flags: Mapping[datetime, tuple[str, ...]]) -> DiffFire:
    return DiffFire(fire, flags.get(fire, ()))
