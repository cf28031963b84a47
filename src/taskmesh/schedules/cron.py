"""Cron expressions evaluated in a time zone: the fire times of one schedule.

Parsing and matching are croniter's; what this module adds is the mapping
from wall-clock times in the schedule's zone to instants, with explicit rules
for the two days a year when that mapping is not one to one. The rules are
those of Vixie cron/cronie (``man 8 cron``), which Sidekiq-cron and Oban
users also meet in practice:

- **Spring forward (a gap).** A wall time that does not exist (02:30 in New
  York on the second Sunday of March) fires at the first valid instant after
  it, the moment of the transition (03:00 EDT). Several missing wall times
  collapse into that one fire.
- **Fall back (a repeat).** A *fixed-time* spec (no ``*`` in its second,
  minute or hour field: ``30 1 * * *``) fires once, in the first pass
  (01:30 EDT, not again at 01:30 EST). An *interval* spec (``*/20 * * * *``,
  ``0 * * * *``, ``* * * * * *``) keeps its rhythm in real time and fires in
  both passes, so an hourly schedule still fires every hour.

croniter alone would fire ``30 1 * * *`` twice on a fall-back day, which is
why the mapping is done here, segment by segment between the zone's offset
changes.

Syntax: 5 fields (minute hour day-of-month month day-of-week), or 6 with
*seconds first* (``*/10 * * * * *``: every ten seconds), as in Quartz, Spring
and Sidekiq-cron; the aliases ``@hourly``, ``@daily`` (``@midnight``),
``@weekly``, ``@monthly``, ``@yearly`` (``@annually``). Day-of-month and
day-of-week combine with OR when both are restricted, as in every cron.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

from taskmesh.errors import CronSpecError

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_ONE_SECOND = timedelta(seconds=1)
_PROBE_STEP = timedelta(hours=6)
"""Offset changes are searched for in steps of this size; real zones never change twice within it."""
_FAST_SPAN = timedelta(days=7)
"""How far :meth:`CronSpec.fires` walks with one croniter before looking for offset changes again."""
_LOOKBACK = timedelta(hours=6)
"""How far back a repeated (fall-back) period can begin; the largest in tzdata is 2 hours."""


def load_zone(name: str) -> ZoneInfo:
    """The IANA zone ``name`` (``Asia/Shanghai``), from the system or the ``tzdata`` package.

    :raises CronSpecError: ``unknown time zone 'Mars/Olympus'``.
    """
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        pass
    close = [z for z in available_timezones() if z.lower() == name.lower()]
    hint = f" (zone names are case-sensitive: {close[0]!r})" if close else ""
    raise CronSpecError(f"unknown time zone {name!r}{hint}")


@dataclass(frozen=True)
class CronSpec:
    """A parsed cron expression bound to a time zone.

    :param expression: the cron text as configured (5 or 6 fields, or an alias).
    :param timezone: an IANA zone name; wall-clock times are read in it.
    :raises CronSpecError: bad syntax, a field out of range, a spec that can
        never fire (``0 0 30 2 *``), or an unknown zone.
    """

    expression: str
    timezone: str = "UTC"
    zone: ZoneInfo = field(init=False, repr=False, compare=False)
    fields: str = field(init=False, repr=False, compare=False)
    interval: bool = field(init=False, repr=False, compare=False)
    """True when the second, minute or hour field holds ``*`` (fires in both passes of a repeat)."""
    _fixed: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        text = " ".join(self.expression.split())
        text = ALIASES.get(text.lower(), text)
        if text.startswith("@"):
            raise CronSpecError(f"unknown alias {self.expression!r}; use one of {', '.join(sorted(ALIASES))}")
        parts = text.split(" ")
        if len(parts) not in (5, 6):
            raise CronSpecError(
                f"{self.expression!r} has {len(parts)} fields; expected 5 (minute hour day month weekday), "
                "6 (seconds first) or an alias like @daily"
            )
        try:
            croniter(text, datetime(2000, 1, 1), second_at_beginning=True)
        except (CroniterBadCronError, CroniterError, ValueError, KeyError) as exc:
            raise CronSpecError(f"{self.expression!r} is not a valid cron expression: {exc}") from None
        try:
            # 2000-01-01 is early enough that a leap-day spec finds 2000-02-29.
            croniter(text, datetime(2000, 1, 1), second_at_beginning=True).get_next(datetime)
        except CroniterBadDateError:
            raise CronSpecError(f"{self.expression!r} can never fire (no such date)") from None
        time_fields = parts[:3] if len(parts) == 6 else parts[:2]
        object.__setattr__(self, "zone", load_zone(self.timezone))
        object.__setattr__(self, "fields", text)
        object.__setattr__(self, "interval", any("*" in f for f in time_fields))
        object.__setattr__(self, "_fixed", self.zone.key in ("UTC", "Etc/UTC", "Etc/GMT", "GMT", "Zulu"))

    # -- wall-clock matching -------------------------------------------------

    def _next_wall(self, after: datetime) -> datetime:
        """The first matching naive wall time strictly after the naive ``after``."""
        result: datetime = croniter(self.fields, after, second_at_beginning=True).get_next(datetime)
        return result

    def _offset(self, instant: datetime) -> timedelta:
        offset = instant.astimezone(self.zone).utcoffset()
        assert offset is not None
        return offset

    def _offset_at(self, timestamp: int) -> timedelta:
        offset = datetime.fromtimestamp(timestamp, self.zone).utcoffset()
        assert offset is not None
        return offset

    def _next_change(self, start: datetime, end: datetime) -> datetime | None:
        """The first instant in ``(start, end]`` where the zone's UTC offset changes (whole seconds)."""
        if self._fixed:
            return None
        low = math.floor(start.timestamp())
        stop = math.ceil(end.timestamp())
        base = self._offset_at(low)
        step = int(_PROBE_STEP.total_seconds())
        while low < stop:
            high = min(low + step, stop)
            if self._offset_at(high) != base:
                while high - low > 1:
                    mid = (low + high) // 2
                    if self._offset_at(mid) != base:
                        high = mid
                    else:
                        low = mid
                change = datetime.fromtimestamp(high, UTC)
                return change if start < change <= end else None
            low = high
        return None

    def _repeat_floor(self, instant: datetime) -> datetime | None:
        """For a fixed-time spec: the naive wall time below which walls at ``instant`` are repeats.

        After a backward change at T (offsets ``o1 > o2``), the instants
        ``[T, T + o1 - o2)`` show the walls ``[T+o2, T+o1)`` a second time; a
        fixed-time spec fired them already, so its walls start again at ``T+o1``.
        """
        last = None
        change = self._next_change(instant - _LOOKBACK, instant)
        while change is not None:
            last = change
            change = self._next_change(change, instant)
        if last is None:
            return None
        before, after = self._offset(last - _ONE_SECOND), self._offset(last)
        if before > after and instant < last + (before - after):
            return (last + before).replace(tzinfo=None)
        return None

    # -- fire times ----------------------------------------------------------

    def next_fire(self, after: datetime) -> datetime:
        """The first fire instant strictly after ``after``.

        Walks the zone's timeline segment by segment (a segment has one UTC
        offset): in each, the next matching wall time minus the offset is the
        candidate; an offset change before the candidate ends the segment and
        applies the gap or repeat rule of the module docstring.

        :param after: an aware datetime (any zone).
        :returns: an aware datetime in UTC, whole seconds.
        :raises ValueError: ``after`` is naive.
        """
        if after.tzinfo is None:
            raise ValueError("after must be an aware datetime")
        start = after.astimezone(UTC)
        inclusive = False  # may a fire land exactly on start? (only at an offset change)
        floor = None if self.interval else self._repeat_floor(start)
        while True:
            offset = self._offset(start)
            wall_after = (start + offset).replace(tzinfo=None)
            if inclusive:
                wall_after -= _ONE_SECOND
            if floor is not None and wall_after < floor - _ONE_SECOND:
                wall_after = floor - _ONE_SECOND
            wall = self._next_wall(wall_after)
            candidate = (wall - offset).replace(tzinfo=UTC)
            change = self._next_change(start, candidate)
            if change is None:
                return candidate
            new_offset = self._offset(change)
            if new_offset > offset:
                # Gap: walls [change+offset, change+new_offset) do not exist; one that
                # matches fires at the change, the first valid instant after it.
                gap_start = (change + offset).replace(tzinfo=None)
                gap_end = (change + new_offset).replace(tzinfo=None)
                if self._next_wall(gap_start - _ONE_SECOND) < gap_end:
                    return change
                floor = None
            else:
                # Repeat: walls [change+new_offset, change+offset) come round again.
                floor = None if self.interval else (change + offset).replace(tzinfo=None)
            start, inclusive = change, True

    def fires(self, after: datetime) -> Iterator[datetime]:
        """Fire instants strictly after ``after``, in order, without end (UTC, whole seconds).

        The same instants as repeated :meth:`next_fire`, faster: inside a stretch
        without offset changes (at most a week is checked at a time) one croniter
        walks the wall times; each change is crossed by :meth:`next_fire`.
        """
        t = after.astimezone(UTC)
        while True:
            t = self.next_fire(t)
            yield t
            offset = self._offset(t)
            horizon = t + _FAST_SPAN
            limit = self._next_change(t, horizon) or horizon
            walls = croniter(self.fields, (t + offset).replace(tzinfo=None), second_at_beginning=True)
            while True:
                candidate = (walls.get_next(datetime) - offset).replace(tzinfo=UTC)
                if candidate >= limit:
                    break  # next_fire takes it from here (and applies the change's rule)
                t = candidate
                yield t

    def fires_between(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """Fire instants in ``(after, until]``, in order."""
        for instant in self.fires(after):
            if instant > until:
                return
            yield instant

    def local(self, instant: datetime) -> datetime:
        """``instant`` as wall-clock time in the schedule's zone."""
        return instant.astimezone(self.zone)
