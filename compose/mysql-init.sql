-- The relay's user: replication, binlog listing, and SELECT on the outbox table only.
CREATE USER IF NOT EXISTS 'cdc'@'%' IDENTIFIED BY 'cdc-secret';
GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'cdc'@'%';
CREATE TABLE IF NOT EXISTS shop.outbox (
  id CHAR(36) PRIMARY KEY,
  aggregatetype VARCHAR(255) NOT NULL,
  aggregateid VARCHAR(255) NOT NULL,
  type VARCHAR(255) NOT NULL,
  payload JSON,
  created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB;
GRANT SELECT ON shop.outbox TO 'cdc'@'%';
