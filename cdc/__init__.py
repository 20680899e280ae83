"""The relay's domain: positions, GTID sets, outbox events, routing, checkpoints and the
relay loop. Nothing here imports an I/O library; adapters live in `connectors/`."""
