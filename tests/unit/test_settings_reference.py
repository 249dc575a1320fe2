"""docs/operations.md's settings table is the code's: every setting, its default, its variable, its meaning."""

import dataclasses

from outboxkit.model import OutboxOptions
from outboxkit.settings import OutboxKitSettings, OutboxOverride
from tests.support.settings_reference import CODE_ONLY, PAGE, documented_table, reference_table, rows


def test_the_settings_table_is_built_from_the_code():
    assert documented_table(PAGE.read_text()) == reference_table(), (
        "docs/operations.md's settings table differs from the code: run python -m tests.support.settings_reference"
    )


def test_every_outbox_option_but_code_has_a_variable_and_every_setting_a_meaning():
    options = {field.name for field in dataclasses.fields(OutboxOptions)}
    assert set(OutboxOverride.model_fields) == options - set(CODE_ONLY)
    described = [*OutboxOverride.model_fields.values(), *OutboxKitSettings.model_fields.values()]
    assert [field for field in described if not field.description] == []
    assert len(rows()) == len(options) + len(OutboxKitSettings.model_fields)
