"""Lab servers for the tests, the benchmarks and the demo - not part of the relay: an
embedded MariaDB (`mariadb.py`), the Kafka stand-in on librdkafka's mock cluster
(`kafka_standin/`: server and client), a Kafka broker with transactions (`noida.py`), and
what they share (`process.py`)."""
