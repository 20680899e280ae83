"""The Confluent-compatible schema registry: its REST client, the Avro schemas and serializer."""
