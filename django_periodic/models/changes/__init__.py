"""What operators change, and how it is recorded: the versions of a schedule (``versions``)
and the single fires they skip or move (``overrides``)."""
