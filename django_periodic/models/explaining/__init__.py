"""What became of a schedule's fires (``Schedule.explain()``, the ``Explaining`` mixin of
``explain``) and what a change would do to its next ones (``Schedule.fire_diff()``, the
``Diffing`` mixin of ``fire_diff``): read from its trigger, calendars, pauses, overrides
and runs, with nothing stored (docs/explain.md)."""
