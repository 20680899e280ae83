"""Lab servers for the tests, the benchmarks and the demo - not part of the relay: an
embedded MariaDB (`mariadb.py`), the Kafka stand-in on librdkafka's mock cluster
(`kafka_standin/`: server and client), a Kafka broker with transactions (`noida.py`), a
RabbitMQ node with streams (`rabbitmq.py`) and a NATS server with JetStream (`nats.py`) on
what those two share (`lab_server.py`), and what they all share (`process.py`)."""
