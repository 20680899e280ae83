"""The verifier's NATS JetStream data source."""
