"""The schedule's pages about change: its versions and their restore (``versions``), its
single-fire overrides (``overrides``), and what became of its fires, with the fires an edit
would change before it is saved (``explain``)."""
