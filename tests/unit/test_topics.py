"""Topic templates and Kafka's topic-name rules."""

import pytest

from cdc.errors import ConfigError
from cdc.events.topics import MAX_TOPIC_LENGTH, TopicRouter, check_template, topic_problem

FIELDS = dict(aggregate_type="order", type="created", schema="shop", table="outbox")


@pytest.mark.parametrize(
    "template",
    [
        "outbox.event.{aggregate_type}",
        "{schema}.{table}.{type}",
        "fixed-topic",
        "{aggregate_type}_{type}",
    ],
)
def test_known_fields_are_accepted(template):
    check_template(template)


@pytest.mark.parametrize(
    "template",
    [
        "outbox.{aggregateType}",
        "{payload}",
        "{}",
        "{0}",
        "{aggregate_type.upper}",
        "{aggregate_type[0]}",
    ],
)
def test_unknown_field_is_a_config_error_naming_the_field(template):
    with pytest.raises(ConfigError, match="unknown field"):
        check_template(template)


@pytest.mark.parametrize("template", ["outbox.{aggregate_type", "outbox.}{"])
def test_malformed_template_is_a_config_error(template):
    with pytest.raises(ConfigError):
        check_template(template)


def test_legal_topic_names():
    for name in ["a", "outbox.event.order", "A-b_c.9", "x" * MAX_TOPIC_LENGTH, "..."]:
        assert topic_problem(name) is None, name


@pytest.mark.parametrize(
    "name,fragment",
    [
        ("", "empty"),
        ("x" * 250, "250 characters"),
        (".", "reserved"),
        ("..", "reserved"),
        ("outbox event", "' '"),
        ("outbox/event", "'/'"),
        ("orders:v1", "':'"),
        ("événement", "'é'"),
    ],
)
def test_illegal_topic_names_say_why(name, fragment):
    problem = topic_problem(name)
    assert problem is not None and fragment in problem


def test_route_renders_the_template():
    route = TopicRouter().route("outbox.event.{aggregate_type}", **FIELDS)
    assert route.topic == "outbox.event.order" and route.problem is None and route.cause is None


def test_route_with_illegal_rendered_topic_is_an_illegal_topic_dead_letter_cause():
    route = TopicRouter().route("outbox.event.{aggregate_type}", **{**FIELDS, "aggregate_type": "bad type"})
    assert route.topic == "outbox.event.bad type"
    assert route.cause == "illegal_topic" and "' '" in route.problem


def test_allowlist_refuses_other_topics_with_topic_not_allowed():
    router = TopicRouter(allowlist=("outbox.event.order", "outbox.event.user*"))
    assert router.route("outbox.event.{aggregate_type}", **FIELDS).problem is None
    assert router.route("outbox.event.{aggregate_type}", **{**FIELDS, "aggregate_type": "users"}).problem is None
    route = router.route("outbox.event.{aggregate_type}", **{**FIELDS, "aggregate_type": "payment"})
    assert route.cause == "topic_not_allowed"
    assert "outbox.event.payment" in route.problem and "allowlist" in route.problem


def test_allowlist_check_does_not_hide_an_illegal_name():
    router = TopicRouter(allowlist=("*",))
    assert router.route("{aggregate_type}", **{**FIELDS, "aggregate_type": "a b"}).cause == "illegal_topic"


def test_cache_distinguishes_field_values_and_templates():
    router = TopicRouter()
    a = router.route("t.{aggregate_type}", **FIELDS)
    b = router.route("t.{aggregate_type}", **{**FIELDS, "aggregate_type": "user"})
    c = router.route("u.{aggregate_type}", **FIELDS)
    assert (a.topic, b.topic, c.topic) == ("t.order", "t.user", "u.order")
    assert router.route("t.{aggregate_type}", **FIELDS).topic == "t.order"


# -- a template whose fixed text can never make a legal topic (refused when the config loads) --


@pytest.mark.parametrize(
    "template,fragment",
    [
        ("outbox events/{aggregate_type}", "characters Kafka does not allow in its fixed text: ' /'"),
        ("{aggregate_type}:v1", "characters Kafka does not allow in its fixed text: ':'"),
        ("événements.{type}", "characters Kafka does not allow in its fixed text: 'é'"),
        ("x" * 250, "250 fixed characters; Kafka allows at most 249"),
        ("x" * 200 + ".{type}." + "y" * 48, "250 fixed characters; Kafka allows at most 249"),
        ("..", "is reserved"),
        ("", "is empty"),
    ],
)
def test_a_template_that_can_never_be_legal_is_a_config_error(template, fragment):
    with pytest.raises(ConfigError) as info:
        check_template(template)
    message = str(info.value)
    assert fragment in message and "\n" not in message, message


@pytest.mark.parametrize(
    "template",
    [
        "{aggregate_type}",
        "{type}",
        "outbox.{aggregate_type}.{type}",
        "x" * 249,
        "x" * 240 + "{type}" + "y" * 9,
        "{schema}..{table}",
    ],
)
def test_only_the_fixed_text_is_checked(template):
    """Placeholders may become anything (a bad value is the row's problem: a dead letter)."""
    check_template(template)


def test_a_template_that_is_not_text_is_a_config_error():
    with pytest.raises(ConfigError, match="must be a string"):
        check_template(42)  # type: ignore[arg-type]  # the wrong type is the test


def test_the_config_names_the_key_of_an_illegal_template():
    from cdc.config import load_config

    raw = {
        "source": {"name": "shop"},
        "outbox": {
            "tables": [
                {"schema": "shop", "table": "outbox"},
                {"schema": "shop", "table": "outbox2", "topic": "outbox events/{aggregate_type}"},
            ]
        },
    }
    with pytest.raises(ConfigError) as info:
        load_config(raw)
    assert str(info.value) == (
        "outbox.tables[1].topic: topic template 'outbox events/{aggregate_type}' has characters Kafka does not "
        "allow in its fixed text: ' /' (a topic name holds only a-z, A-Z, 0-9, '.', '_' and '-')"
    )
