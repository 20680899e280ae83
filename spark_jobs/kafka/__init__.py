"""The verifier's Kafka data sources: batch (offset ranges) and streaming."""
