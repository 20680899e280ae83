"""RabbitMQ: the Streams sink (stream protocol, rstream) and the AMQP 1.0 message it stores."""
