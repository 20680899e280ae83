"""MySQL and MariaDB: the binlog client and decoder, the reader process, preflight, the lease and replica sessions."""
