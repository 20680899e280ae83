"""Kafka: the sink, the topics' reader, the preflight checks and the client's logging."""
