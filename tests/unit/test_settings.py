"""Per-outbox overrides from the environment reach the drain; bad ones fail at start-up.

Every test builds the kit on an engine that never connects (the kit reads
settings and registers outboxes without touching the database); a real drain
under an overridden table is in tests/integration/test_settings.py.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import DeclarativeBase

from outboxkit import (
    CallableTransport,
    ConfigurationError,
    Delivery,
    Outbox,
    OutboxKit,
    OutboxKitSettings,
    OutboxOptions,
)
from outboxkit.policy import RetryPolicy
from outboxkit.rate_limits import RateLimit
from outboxkit.settings import NON_SETTING_PREFIXES, NON_SETTING_VARIABLES
from tests.support.models import SampleEvent

# Nothing listens on port 1: a test that connected by mistake would fail loudly.
NEVER_CONNECTED = "postgresql+psycopg://nobody@127.0.0.1:1/never_connected"


class LeasedBase(DeclarativeBase):
    pass


class LeasedEvent(Outbox, LeasedBase):
    """An outbox with an explicit lease, to show a timeout override that would outgrow it is refused."""

    __tablename__ = "leased_event_outbox"
    __outbox__ = OutboxOptions(job_name="leased-events", batch_size=10, concurrency=10, timeout=5, lease=60)

    def build_delivery(self) -> Delivery:
        return Delivery(url="http://127.0.0.1:1/leased")


class LimitedEvent(Outbox, LeasedBase):
    """An outbox with a rate limit in code, which the RATE_LIMIT setting replaces."""

    __tablename__ = "limited_event_outbox"
    __outbox__ = OutboxOptions(job_name="limited-events", rate_limit=RateLimit(per_second=5))

    def build_delivery(self) -> Delivery:
        return Delivery(url="http://127.0.0.1:1/limited")


class RetainedEvent(Outbox, LeasedBase):
    """An outbox that keeps delivered rows a week in code, which the RETAIN_DONE_FOR setting replaces."""

    __tablename__ = "retained_event_outbox"
    __outbox__ = OutboxOptions(job_name="retained-events", retain_done_for=7 * 86400)

    def build_delivery(self) -> Delivery:
        return Delivery(url="http://127.0.0.1:1/retained")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start every test from no outboxkit settings, whatever the developer's shell holds."""
    for name in list(os.environ):
        upper = name.upper()
        if upper.startswith("OUTBOXKIT_") and upper not in NON_SETTING_VARIABLES and not upper.startswith(NON_SETTING_PREFIXES):
            monkeypatch.delenv(name)


@pytest.fixture
def offline_engine() -> Iterator[Engine]:
    engine = create_engine(NEVER_CONNECTED)
    yield engine
    engine.dispose()


def kit_policy(engine: Engine, outbox: type[Outbox] = SampleEvent) -> RetryPolicy:
    with OutboxKit(engine, [outbox], transport=CallableTransport(lambda delivery, key: 200)) as kit:
        return kit.drainer(outbox).policy


def test_without_overrides_the_class_options_are_in_force(offline_engine):
    assert kit_policy(offline_engine) == RetryPolicy(backoff=(1, 2, 4), max_attempts=5)


def test_nested_variables_override_backoff_and_max_attempts(offline_engine, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__MAX_ATTEMPTS", "3")
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BACKOFF", "1,2")
    assert kit_policy(offline_engine) == RetryPolicy(backoff=(1, 2), max_attempts=3)


def test_nested_backoff_accepts_one_step_and_spaces(offline_engine, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BACKOFF", "30")
    assert kit_policy(offline_engine).backoff == (30.0,)
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BACKOFF", " 0.5, 10 ,60")
    assert kit_policy(offline_engine).backoff == (0.5, 10.0, 60.0)


def test_the_json_form_overrides_backoff_and_max_attempts(offline_engine, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES", '{"sample-events": {"backoff": [1, 2], "max_attempts": 3}}')
    assert kit_policy(offline_engine) == RetryPolicy(backoff=(1, 2), max_attempts=3)


def test_the_json_form_accepts_the_underscore_key(offline_engine, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES", '{"sample_events": {"max_attempts": 7}}')
    assert kit_policy(offline_engine) == RetryPolicy(backoff=(1, 2, 4), max_attempts=7)


def test_an_override_leaves_the_other_options_alone(offline_engine, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__MAX_ATTEMPTS", "3")
    with OutboxKit(offline_engine, [SampleEvent], transport=CallableTransport(lambda delivery, key: 200)) as kit:
        options = kit.options(SampleEvent)
    assert options.max_attempts == 3
    assert options.backoff == (1, 2, 4)
    assert (options.job_name, options.batch_size, options.concurrency, options.timeout) == ("sample-events", 50, 32, 10.0)
    assert SampleEvent.__outbox__.max_attempts == 5  # the class itself is untouched


def kit_rate_limit(engine: Engine) -> RateLimit | None:
    with OutboxKit(engine, [LimitedEvent], transport=CallableTransport(lambda delivery, key: 200)) as kit:
        return kit.options(LimitedEvent).rate_limit


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("20", RateLimit(per_second=20)),
        (" 0.5 ", RateLimit(per_second=0.5)),
        ('{"destinations": {"https://slow.example:443": 2}, "burst_seconds": 0.25}',
         RateLimit(destinations={"https://slow.example:443": 2}, burst_seconds=0.25)),
        ('{"per_second": 50, "destinations": {"https://slow.example:443": 2}}',
         RateLimit(per_second=50, destinations={"https://slow.example:443": 2})),
        ("off", None),
        ("OFF", None),
    ],
)
def test_the_rate_limit_variable_replaces_the_class_limit(offline_engine, monkeypatch, value, expected):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__LIMITED_EVENTS__RATE_LIMIT", value)
    assert kit_rate_limit(offline_engine) == expected
    assert LimitedEvent.__outbox__.rate_limit == RateLimit(per_second=5)  # the class itself is untouched


@pytest.mark.parametrize(
    ("value", "expected"), [(None, 1.0), ("2.5", 2.5), ("off", None), ("OFF", None), (" Off ", None)]
)
def test_the_hung_send_seconds_variable_replaces_the_class_option(offline_engine, monkeypatch, value, expected):
    if value is not None:
        monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__HUNG_SEND_SECONDS", value)
    assert OutboxKit(offline_engine, [SampleEvent]).options(SampleEvent).hung_send_seconds == expected


@pytest.mark.parametrize(("value", "expected"), [(None, None), ("200", 200), ("auto", None)])
def test_the_hung_send_limit_variable_replaces_the_class_option(offline_engine, monkeypatch, value, expected):
    if value is not None:
        monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__HUNG_SEND_LIMIT", value)
    assert OutboxKit(offline_engine, [SampleEvent]).options(SampleEvent).hung_send_limit == expected


@pytest.mark.parametrize(
    ("value", "expected"), [(None, 604800), ("86400", 86400), ("off", None), ("OFF", None), (" Off ", None)]
)
def test_the_retain_done_for_variable_replaces_the_class_option(offline_engine, monkeypatch, value, expected):
    if value is not None:
        monkeypatch.setenv("OUTBOXKIT_OUTBOXES__RETAINED_EVENTS__RETAIN_DONE_FOR", value)
    with OutboxKit(offline_engine, [RetainedEvent]) as kit:
        assert kit.options(RetainedEvent).retain_done_for == expected
    assert RetainedEvent.__outbox__.retain_done_for == 604800  # the class itself is untouched


def test_off_in_any_case_in_the_json_form(offline_engine, monkeypatch):
    outboxes = '{"retained-events": {"retain_done_for": "OFF", "hung_send_seconds": "Off", "rate_limit": "oFF"}}'
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES", outboxes)
    with OutboxKit(offline_engine, [RetainedEvent]) as kit:
        options = kit.options(RetainedEvent)
    assert (options.retain_done_for, options.hung_send_seconds, options.rate_limit) == (None, None, None)


def test_the_rate_limit_in_the_json_form_and_the_class_limit_without_a_setting(offline_engine, monkeypatch):
    assert kit_rate_limit(offline_engine) == RateLimit(per_second=5)
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES", '{"limited-events": {"rate_limit": {"per_second": 7}}}')
    assert kit_rate_limit(offline_engine) == RateLimit(per_second=7)
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES", '{"limited-events": {"rate_limit": "off"}}')
    assert kit_rate_limit(offline_engine) is None


# -- refused at start-up ---------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OUTBOXKIT_OUTBOXES__NOPE__MAX_ATTEMPTS", "3"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENT__BACKOFF", "1,2"),
    ],
)
def test_an_unknown_outbox_name_is_refused(offline_engine, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    unknown = variable.split("__")[1]
    with pytest.raises(ConfigurationError, match=rf"OUTBOXKIT_OUTBOXES__{unknown}__\*.*registered: sample_events"):
        OutboxKit(offline_engine, [SampleEvent])


def test_the_json_form_and_the_variables_merge(offline_engine, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES", '{"sample-events": {"max_attempts": 3}}')
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BACKOFF", "1,2")
    assert kit_policy(offline_engine) == RetryPolicy(backoff=(1, 2), max_attempts=3)


@pytest.mark.parametrize(
    ("json_variable", "json_value"),
    [
        ("OUTBOXKIT_OUTBOXES", '{"sample-events": {"max_attempts": 3}}'),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS", '{"max_attempts": 3}'),
    ],
)
def test_one_setting_in_both_forms_is_refused_naming_both(offline_engine, monkeypatch, json_variable, json_value):
    monkeypatch.setenv(json_variable, json_value)
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__MAX_ATTEMPTS", "5")
    expected = rf"{json_variable}.* and .*OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__MAX_ATTEMPTS both set sample_events.max_attempts"
    with pytest.raises(ConfigurationError, match=expected):
        OutboxKit(offline_engine, [SampleEvent])


def test_two_spellings_of_one_outbox_in_the_json_form_merge_or_are_refused(offline_engine, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES", '{"sample-events": {"max_attempts": 3}, "sample_events": {"backoff": [1]}}')
    assert kit_policy(offline_engine) == RetryPolicy(backoff=(1,), max_attempts=3)
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES", '{"sample-events": {"max_attempts": 3}, "sample_events": {"max_attempts": 4}}')
    with pytest.raises(ConfigurationError, match=r"'sample-events'\) and OUTBOXKIT_OUTBOXES \(as 'sample_events'\) both set"):
        OutboxKit(offline_engine, [SampleEvent])


def test_an_unknown_outbox_name_in_the_json_form_is_refused(offline_engine, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES", '{"credit-grants": {"max_attempts": 3}}')
    with pytest.raises(ConfigurationError, match=r"unknown outbox\(es\) \['credit_grants'\].*OUTBOXKIT_OUTBOXES"):
        OutboxKit(offline_engine, [SampleEvent])


@pytest.mark.parametrize(
    ("variable", "value", "complaint"),
    [
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__MAX_ATTEMPTS", "0", "greater than or equal to 1"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__MAX_ATTEMPTS", "lots", "valid integer"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__MAX_ATTEMPTS", "2.5", "valid integer"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BACKOFF", "1,soon", "valid number"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BACKOFF", "1,,2", "valid number"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BACKOFF", "-1", "greater than or equal to 0"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BACKOFF", "5,inf", "finite number"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BACKOFF", "", "valid number"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__TIMEOUT", "0", "greater than 0"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BATCH_SIZE", "100000", "less than or equal to 10000"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RATE_LIMIT", "0", "per_second: Input should be greater than 0"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RATE_LIMIT", "-3", "per_second: Input should be greater than 0"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RATE_LIMIT", "fast", 'expected requests per second (e.g. 20), "off", or a JSON'),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RATE_LIMIT", "nan", "expected requests per second"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RATE_LIMIT", "Infinity", "per_second: Input should be a finite number"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RATE_LIMIT", "[5]", "expected requests per second"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RATE_LIMIT", "true", "expected requests per second"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RATE_LIMIT", '{"per_second": 5', "expected requests per second"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RATE_LIMIT", "{}", "it limits nothing: give per_second (every destination)"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RATE_LIMIT", '{"destinations": {}}', "it limits nothing"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RATE_LIMIT", '{"per_second": 5, "burst": 2}', "burst: Extra inputs are not"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RATE_LIMIT", '{"per_second": 5, "burst_seconds": 0}', "burst_seconds: Input should"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RATE_LIMIT", '{"destinations": {"https://a:443": "x"}}',
         "destinations.https://a:443: Input should be a valid number"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RATE_LIMIT", '{"destinations": {"https://a:443": 0}}',
         "destinations.https://a:443: Input should be greater than 0"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RATE_LIMIT", '{"destinations": {"": 2}}', "String should have at least 1 character"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__HUNG_SEND_SECONDS", "0", "greater than 0"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__HUNG_SEND_SECONDS", "soon", "valid number"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__HUNG_SEND_SECONDS", "inf", "finite number"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__HUNG_SEND_SECONDS", "of", "valid number"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RETAIN_DONE_FOR", "offf", "valid number"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RETRIES", "3", "per-outbox settings are backoff, max_attempts"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS", "3", "valid dictionary"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BREAKER", '{"retries": 3}', "retries: Extra inputs are not permitted"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BREAKER", "sometimes", "a JSON object of BreakerOptions' arguments"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__DESTINATION_CONCURRENCY", "0", "greater than or equal to 1"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__LEASE_MARGIN", "-1", "greater than 0"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__LEASE", "soon", "valid number"),
        ("OUTBOXKIT_ENVIRONMENT", "prod", "'production'"),
    ],
)
def test_an_invalid_variable_is_refused_by_name(offline_engine, monkeypatch, variable, value, complaint):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as raised:
        OutboxKit(offline_engine, [SampleEvent])
    message = str(raised.value)
    assert f"{variable}:" in message
    assert complaint in message


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ('{"sample-events": {"max_attempts": 0}}', "OUTBOXKIT_OUTBOXES (at sample_events.max_attempts)"),
        ('{"sample-events": {"backoff": []}}', "OUTBOXKIT_OUTBOXES (at sample_events.backoff)"),
        ('{"sample-events": {"backoff": "1,x"}}', "OUTBOXKIT_OUTBOXES (at sample_events.backoff)"),
        ('{"sample-events": 3}', "OUTBOXKIT_OUTBOXES (at sample_events)"),
        ('{"sample-events": {"max_attempts": 3}', "OUTBOXKIT_OUTBOXES could not be parsed"),
        ("max_attempts=3", "OUTBOXKIT_OUTBOXES could not be parsed"),
        ('{"sample-events": {"rate_limit": {"per_second": -1}}}',
         "OUTBOXKIT_OUTBOXES (at sample_events.rate_limit): Value error, per_second: Input should be greater than 0"),
    ],
)
def test_an_invalid_json_form_is_refused_by_name(offline_engine, monkeypatch, value, complaint):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES", value)
    with pytest.raises(ConfigurationError) as raised:
        OutboxKit(offline_engine, [SampleEvent])
    assert complaint in str(raised.value)


def test_an_override_that_breaks_the_lease_is_refused_with_a_fix(offline_engine, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__LEASED_EVENTS__TIMEOUT", "120")
    with pytest.raises(ConfigurationError) as raised:
        OutboxKit(offline_engine, [LeasedEvent])
    message = str(raised.value)
    assert message.startswith("OUTBOXKIT_OUTBOXES__LEASED_EVENTS:")
    assert "lease 60s is shorter than the slowest batch" in message
    assert "raise lease or concurrency" in message


def test_explicit_settings_are_used_instead_of_the_environment(offline_engine, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__MAX_ATTEMPTS", "3")
    settings = OutboxKitSettings.model_validate({"outboxes": {"sample-events": {"max_attempts": 9}}})
    with OutboxKit(offline_engine, [SampleEvent], settings=settings, transport=CallableTransport(lambda d, k: 200)) as kit:
        assert kit.drainer(SampleEvent).policy.max_attempts == 9


# -- unknown names are refused, not ignored -----------------------------------------


def test_a_name_close_to_nothing_is_refused_with_the_list_of_settings(offline_engine, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_COLOUR", "blue")
    with pytest.raises(ConfigurationError, match=r"OUTBOXKIT_COLOUR: no such setting; the settings are OUTBOXKIT_<one of"):
        OutboxKit(offline_engine, [SampleEvent])


@pytest.mark.parametrize(
    ("variable", "complaint"),
    [
        ("OUTBOXKIT_LEADER_TICK", "no such setting (did you mean OUTBOXKIT_LEADER_TICK_SECONDS?)"),
        ("OUTBOXKIT_ENVIROMENT", "no such setting (did you mean OUTBOXKIT_ENVIRONMENT?)"),
        ("OUTBOXKIT_DRAIN_INTERVAL", "no such setting (did you mean OUTBOXKIT_DRAIN_INTERVAL_SECONDS?)"),
        ("OUTBOXKIT_LISTEN_ENABLE", "no such setting (did you mean OUTBOXKIT_LISTEN_ENABLED?)"),
        ("OUTBOXKIT_OUTBOX__SAMPLE_EVENTS__MAX_ATTEMPTS", "no such setting (did you mean OUTBOXKIT_OUTBOXES?)"),
        (
            "OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__MAX_ATEMPTS",
            "no such per-outbox setting (did you mean OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__MAX_ATTEMPTS?); "
            "per-outbox settings are backoff, max_attempts, batch_size, concurrency, timeout",
        ),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BACKOF", "(did you mean OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BACKOFF?)"),
        ("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__MAX__ATTEMPTS", "look like OUTBOXKIT_OUTBOXES__<KEY>__<SETTING>"),
        ("OUTBOXKIT_OUTBOXES____MAX_ATTEMPTS", "look like OUTBOXKIT_OUTBOXES__<KEY>__<SETTING>"),
        ("OUTBOXKIT_LEADER_TICK_SECONDS__FAST", "OUTBOXKIT_LEADER_TICK_SECONDS takes no nested keys"),
    ],
)
def test_a_misspelt_setting_is_refused_with_the_closest_name(offline_engine, monkeypatch, variable, complaint):
    monkeypatch.setenv(variable, "3")
    with pytest.raises(ConfigurationError) as raised:
        OutboxKit(offline_engine, [SampleEvent])
    assert f"{variable}: " in str(raised.value)
    assert complaint in str(raised.value)


def test_every_unknown_name_is_listed_at_once(offline_engine, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_LEADER_TICK", "3")
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__MAX_ATEMPTS", "3")
    with pytest.raises(ConfigurationError) as raised:
        OutboxKit(offline_engine, [SampleEvent])
    assert "OUTBOXKIT_LEADER_TICK:" in str(raised.value)
    assert "OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__MAX_ATEMPTS:" in str(raised.value)


def test_settings_built_directly_refuse_unknown_names_too(monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_LEADER_TICK", "3")
    with pytest.raises(ConfigurationError, match="did you mean OUTBOXKIT_LEADER_TICK_SECONDS"):
        OutboxKitSettings()


def test_every_outboxkit_variable_the_repository_uses_is_a_setting_or_allowed():
    """The allow-list covers what the kit's CLI, tests, benchmarks and docs read."""
    from outboxkit.settings import OutboxKitSettings
    from outboxkit.settings.variables import unknown_variable

    root = Path(__file__).resolve().parents[2]
    typo_examples = {"OUTBOXKIT_LEADER_TICK", "OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__MAX_ATEMPTS"}  # in the docs, on purpose
    unknown = {}
    for folder in ("outboxkit", "tests", "bench", "admin", "alembic", "docs", ".ci"):
        for path in (root / folder).rglob("*"):
            if path == Path(__file__).resolve() or not path.is_file() or path.suffix not in (".py", ".md", ".ini", ".toml", ""):
                continue
            # A whole name only: typer's completion variable _OUTBOXKIT_COMPLETE is not an OUTBOXKIT_ one.
            names = re.findall(r"(?<![A-Za-z0-9_])OUTBOXKIT_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace"))
            for name in names:
                if name not in typo_examples and unknown_variable(name, OutboxKitSettings.model_fields):
                    unknown[name] = path.relative_to(root)
    assert unknown == {}


@pytest.mark.parametrize(("value", "expected"), [(None, True), ("false", False), ("true", True)])
def test_claims_and_outcomes_wait_for_the_wal_flush_unless_turned_off(offline_engine, monkeypatch, value, expected):
    if value is not None:
        monkeypatch.setenv("OUTBOXKIT_SYNCHRONOUS_COMMIT", value)
    with OutboxKit(offline_engine, [SampleEvent], transport=CallableTransport(lambda delivery, key: 200)) as kit:
        queries = kit.drainer(SampleEvent).queries
    assert kit.settings.synchronous_commit is expected and queries.synchronous_commit is expected
    # Turned off, the claim carries the SET LOCAL that makes its own commit asynchronous.
    assert ("set_config('synchronous_commit', 'off', true)" in queries._claim_driver_sql) is not expected



@pytest.mark.parametrize(
    ("variable", "value", "attribute", "expected"),
    [
        ("LEASE", "600", "lease", 600),
        ("LEASE", "auto", "lease", None),
        ("LEASE_MARGIN", "12.5", "lease_margin", 12.5),
        ("DESTINATION_CONCURRENCY", "3", "destination_concurrency", 3),
        ("DESTINATION_CONCURRENCY", "Auto", "destination_concurrency", None),
        ("SIGN_WEBHOOKS", "false", "sign_webhooks", False),
    ],
)
def test_lease_caps_and_signing_have_variables(offline_engine, monkeypatch, variable, value, attribute, expected):
    monkeypatch.setenv(f"OUTBOXKIT_OUTBOXES__LEASED_EVENTS__{variable}", value)
    with OutboxKit(offline_engine, [LeasedEvent]) as kit:
        assert getattr(kit.options(LeasedEvent), attribute) == expected


def test_the_breaker_variable_changes_the_fields_it_names_or_turns_it_off(offline_engine, monkeypatch):
    from outboxkit.breaker import BreakerOptions

    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BREAKER", '{"failures": 9, "cool_down": 45}')
    assert OutboxKit(offline_engine, [SampleEvent]).options(SampleEvent).breaker == BreakerOptions(failures=9, cool_down=45)
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BREAKER", "OFF")
    assert OutboxKit(offline_engine, [SampleEvent]).options(SampleEvent).breaker is None
    assert SampleEvent.__outbox__.breaker == BreakerOptions()  # the class itself is untouched


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("BREAKER", '{"failures": 0}', "OUTBOXKIT_OUTBOXES__LEASED_EVENTS: BreakerOptions.failures"),
        ("LEASE", "5", "OUTBOXKIT_OUTBOXES__LEASED_EVENTS: .*lease 5.0s is shorter than the slowest batch"),
        ("DESTINATION_CONCURRENCY", "11", "OUTBOXKIT_OUTBOXES__LEASED_EVENTS: .*destination_concurrency must be"),
    ],
)
def test_lease_cap_and_breaker_values_the_kit_refuses_name_their_outbox(offline_engine, monkeypatch, variable, value, message):
    monkeypatch.setenv(f"OUTBOXKIT_OUTBOXES__LEASED_EVENTS__{variable}", value)
    with pytest.raises(ConfigurationError, match=message):
        OutboxKit(offline_engine, [LeasedEvent])
