"""Where a run resumes: the checkpoint, its writer, recovery on start, adoption from Debezium."""
