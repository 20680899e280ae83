"""The verifier's own readers of the MySQL side: the binlog (python-mysql-replication and its own event readers) and the outbox table."""
