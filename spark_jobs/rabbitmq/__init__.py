"""The verifier's RabbitMQ Streams data source."""
