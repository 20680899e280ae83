"""Debezium's files: its stored offsets, read and written as Java writes them."""
