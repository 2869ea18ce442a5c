"""Planning: due schedules become runs, exactly once per plan time (decided without the
database, then recorded); backfills, extra runs under the overlap policy, the look ahead."""
