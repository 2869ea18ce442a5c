"""A run's life once planned: claimed under a lease, marked started, its lease renewed,
its outcome recorded, retried or handed to a tasks backend."""
