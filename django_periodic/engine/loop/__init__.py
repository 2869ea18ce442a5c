"""The scheduler process: its loop, worker threads, executor, housekeeping, wake-ups and
stop."""
