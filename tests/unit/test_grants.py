"""SHOW GRANTS lines -> global privileges, by exact name (connectors/mysql/preflight.py)."""

from connectors.mysql.preflight import EVERYTHING, REPLICATION_SLAVE, global_privileges, has_privilege

PW = " IDENTIFIED BY PASSWORD '*B69027D44F6E5EDC07F1AEAD1477967B16F28227'"


def test_a_privilege_whose_name_holds_another_is_not_that_other():
    privileges = global_privileges([f"GRANT REPLICATION SLAVE ADMIN, REPLICATION MASTER ADMIN ON *.* TO `u`@`%`{PW}"])
    assert privileges == {"REPLICATION SLAVE ADMIN", "REPLICATION MASTER ADMIN"}
    assert not has_privilege(privileges, *REPLICATION_SLAVE)


def test_each_privilege_of_a_global_grant_counts():
    privileges = global_privileges(
        [
            "GRANT USAGE ON *.* TO `u`@`%`",
            "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `u`@`%`",
            "GRANT APPLICATION_PASSWORD_ADMIN,XA_RECOVER_ADMIN ON *.* TO `u`@`%`",  # MySQL 8 dynamic privileges
        ]
    )
    assert privileges == {
        "USAGE",
        "REPLICATION SLAVE",
        "BINLOG MONITOR",
        "APPLICATION_PASSWORD_ADMIN",
        "XA_RECOVER_ADMIN",
    }
    assert has_privilege(privileges, *REPLICATION_SLAVE)


def test_only_grants_on_star_dot_star_are_global():
    privileges = global_privileges(
        [
            "GRANT ALL PRIVILEGES ON `shop`.* TO `u`@`%`",
            "GRANT SELECT (`a`, `b`), INSERT ON `shop`.`outbox` TO `u`@`%`",
            "GRANT PROXY ON ''@'%' TO 'u'@'%' WITH GRANT OPTION",
            "GRANT `replication_role` TO `u`@`%`",
            "SET DEFAULT ROLE `replication_role` FOR `u`@`%`",
        ]
    )
    assert privileges == set()
    assert not has_privilege(privileges, *REPLICATION_SLAVE)


def test_all_on_star_dot_star_is_everything():
    for line in (
        f"GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost`{PW} WITH GRANT OPTION",
        "grant all on *.* to 'root'@'%'",
    ):
        privileges = global_privileges([line])
        assert privileges == {EVERYTHING}, line
        assert has_privilege(privileges, *REPLICATION_SLAVE) and has_privilege(privileges, "BINLOG MONITOR")


def test_an_active_roles_global_grant_counts():
    """MariaDB lists the active (default) role's grants in SHOW GRANTS, nested roles too."""
    privileges = global_privileges(
        [
            "GRANT `r1` TO `u`@`127.0.0.1`",
            "GRANT `r2` TO `r1`",
            "GRANT REPLICATION SLAVE ON *.* TO `r2`",
        ]
    )
    assert has_privilege(privileges, *REPLICATION_SLAVE)
