"""The engine, in the order a run goes through it: ``planning`` turns due schedules into
runs, ``runs`` claims them, marks them started, leases and records their outcomes (and
decides retries), ``loop`` is the process that drives both and calls the jobs, and
``backends`` holds the ledger's statements for PostgreSQL and for any other database."""
