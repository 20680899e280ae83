"""What a message is: the outbox mapping, identity headers, topic routing, output formats, dead letters."""
