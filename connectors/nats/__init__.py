"""NATS JetStream: the sink and its connection."""
