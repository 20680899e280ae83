"""A MySQL 8.4 / 9.x lab for tests, where no MySQL server can be installed: a server that
speaks MySQL's client and replication protocol (server.py) over binlog files written as
MySQL writes them (binlog_writer.py), and `MysqlLab` (lab.py) that runs both."""
