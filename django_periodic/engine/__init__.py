"""The engine, in the order a run goes through it: ``planning`` turns due schedules into
runs, ``runs`` claims them, marks them started, leases and records their outcomes (and
decides retries), ``loop`` is the process that drives both and calls the jobs. Below them,
the parts both share (``overlap``, ``fleet``, ``batches``, ``tracing``), then ``backends``,
the ledger's statements (a class per database: SQLite's through the ORM, the base, and
PostgreSQL's own), and at the bottom ``records``, the plain data they hand each other.
``operations`` is the models' way in (``db.ledger``)."""
