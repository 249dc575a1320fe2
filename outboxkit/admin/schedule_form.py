"""The schedule form of the admin pages: its inputs, read into a schedule request, and each refusal put next to its input.

The form is flat HTML (it works without JavaScript), so a few inputs hold
structured values, one per line:

* ``trigger_fields``: ``name=value`` lines, e.g. ``hour=3`` and ``minute=30``
  (cron), ``minutes=5`` (every), ``at=2030-01-01T06:00:00+01:00`` (once).
  A whole number is sent as a number, anything else as text (``*/5``,
  ``mon-fri``, ``1,15``);
* ``http_headers``: ``Name: value`` lines;
* ``http_body``: JSON (empty: no body).

Every refusal, whether of the form's own reading (``FormRefused``), of the
request model or of the schedule rules (``InvalidScheduleError``, whose
``field`` is a dotted path such as ``trigger.fields.minute``), becomes
``{input name: message}``, so the page shows it next to the input at fault.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from outboxkit.operations.schedule_schemas import ScheduleCreate, ScheduleFields, ScheduleModel

__all__ = ["FORM_INPUTS", "FormRefused", "ScheduleForm", "input_for"]

Request = TypeVar("Request", ScheduleCreate, ScheduleFields)

FORM_INPUTS = (
    "name", "trigger_kind", "trigger_fields", "timezone", "target_kind", "job", "http_method", "http_url", "http_outbox",
    "http_headers", "http_body", "misfire_grace_seconds", "max_running", "rerun_if_abandoned", "enabled",
)
MAX_INPUT_CHARS = 20_000
_WHOLE = re.compile(r"-?[0-9]{1,12}")
# The schedule rules' dotted field (or its first part) -> the input that holds it.
_INPUTS = {
    "name": "name",
    "trigger.kind": "trigger_kind",
    "trigger.timezone": "timezone",
    "trigger.fields": "trigger_fields",
    "trigger": "trigger_kind",
    "target.job": "job",
    "target.url": "http_url",
    "target.method": "http_method",
    "target.headers": "http_headers",
    "target.body": "http_body",
    "target.outbox": "http_outbox",
    "target.kind": "target_kind",
    "target": "target_kind",
    "enabled": "enabled",
    "misfire_grace_seconds": "misfire_grace_seconds",
    "max_running": "max_running",
    "rerun_if_abandoned": "rerun_if_abandoned",
}


class FormRefused(Exception):
    """The form's inputs do not make a schedule: ``errors`` maps each input at fault to what is wrong."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{name}: {message}" for name, message in errors.items()))
        self.errors = errors


def input_for(dotted: str) -> str:
    """The form input that holds the schedule field ``dotted`` (``trigger.fields.minute`` -> ``trigger_fields``)."""
    parts = dotted.split(".")
    for length in range(len(parts), 0, -1):
        found = _INPUTS.get(".".join(parts[:length]))
        if found is not None:
            return found
    return "name"


@dataclass
class ScheduleForm:
    """What the form shows: each input's text, and the errors next to them."""

    values: dict[str, str]
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def blank(cls) -> ScheduleForm:
        return cls(values={
            "trigger_kind": "cron", "timezone": "UTC", "target_kind": "job", "http_method": "POST",
            "misfire_grace_seconds": "300", "max_running": "1", "enabled": "on",
        })

    @classmethod
    def of(cls, schedule: ScheduleModel) -> ScheduleForm:
        """The form of an existing schedule (the edit page)."""
        definition = schedule.definition
        trigger, target = definition.trigger, definition.target
        values = {
            "name": schedule.name,
            "trigger_kind": trigger.kind,
            "trigger_fields": "\n".join(f"{name}={value}" for name, value in trigger.fields.items()),
            "timezone": trigger.timezone,
            "target_kind": target.kind,
            "misfire_grace_seconds": str(definition.misfire_grace_seconds),
            "max_running": str(definition.max_running),
        }
        if definition.enabled:
            values["enabled"] = "on"
        if definition.rerun_if_abandoned:
            values["rerun_if_abandoned"] = "on"
        if target.kind == "job":
            values["job"] = target.job
        else:
            values.update(
                http_method=target.method, http_url=target.url, http_outbox=target.outbox,
                http_headers="\n".join(f"{name}: {value}" for name, value in target.headers.items()),
                http_body="" if target.body is None else json.dumps(target.body, indent=2),
            )
        return cls(values=values)

    @classmethod
    def posted(cls, form: Mapping[str, Any]) -> ScheduleForm:
        """The submitted inputs (text only, capped), to read and, if refused, to show again."""
        values = {}
        for name in FORM_INPUTS:
            value = form.get(name)
            if isinstance(value, str):
                values[name] = value[:MAX_INPUT_CHARS]
        return cls(values=values)

    # -- reading ---------------------------------------------------------------

    def create_request(self) -> ScheduleCreate:
        return self._validated(ScheduleCreate, {"name": self.values.get("name", "").strip(), **self._document()})

    def edit_request(self) -> ScheduleFields:
        return self._validated(ScheduleFields, self._document())

    def refuse(self, dotted_field: str, message: str) -> ScheduleForm:
        """The same form with ``message`` next to the input of the schedule field ``dotted_field``."""
        return ScheduleForm(values=self.values, errors={**self.errors, input_for(dotted_field): message})

    def _text(self, name: str) -> str:
        return self.values.get(name, "").strip()

    def _document(self) -> dict[str, Any]:
        """The request as JSON values; every input that cannot be read is collected, then refused together."""
        errors: dict[str, str] = {}
        document: dict[str, Any] = {
            "trigger": {
                "kind": self._text("trigger_kind"),
                "fields": self._lines("trigger_fields", "=", errors, numbers=True),
                "timezone": self._text("timezone") or "UTC",
            },
            "enabled": self.values.get("enabled") == "on",
            "rerun_if_abandoned": self.values.get("rerun_if_abandoned") == "on",
        }
        for name in ("misfire_grace_seconds", "max_running"):
            text = self._text(name)
            if not (text.isascii() and _WHOLE.fullmatch(text)):
                errors[name] = f"must be a whole number, got {text[:40]!r}"
            else:
                document[name] = int(text)
        if self._text("target_kind") == "http":
            target: dict[str, Any] = {
                "kind": "http", "url": self._text("http_url"), "outbox": self._text("http_outbox"),
                "method": self._text("http_method") or "POST", "headers": self._lines("http_headers", ":", errors),
            }
            body = self._text("http_body")
            if body:
                try:
                    target["body"] = json.loads(body)
                except ValueError as exc:
                    errors["http_body"] = f"must be JSON (or empty for no body): {exc}"
            document["target"] = target
        elif self._text("target_kind") == "job":
            document["target"] = {"kind": "job", "job": self._text("job")}
        else:
            errors["target_kind"] = "choose a registered job or an HTTP request"
        if errors:
            raise FormRefused(errors)
        return document

    def _lines(self, name: str, separator: str, errors: dict[str, str], *, numbers: bool = False) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for number, line in enumerate(self.values.get(name, "").splitlines(), start=1):
            if not line.strip():
                continue
            key, sign, value = line.partition(separator)
            key, value = key.strip(), value.strip()
            if not sign or not key:
                errors[name] = f"line {number} must look like name{separator}value, got {line.strip()[:60]!r}"
                return {}
            if key in found:
                errors[name] = f"{key} is given twice"
                return {}
            found[key] = int(value) if numbers and value.isascii() and _WHOLE.fullmatch(value) else value
        return found

    def _validated(self, model: type[Request], document: dict[str, Any]) -> Request:
        try:
            return model.model_validate(document)
        except ValidationError as exc:
            errors: dict[str, str] = {}
            for problem in exc.errors(include_url=False):
                # A tagged union puts the tag in loc ("target", "http", "url"): drop it to reach the field.
                loc = [str(part) for part in problem["loc"]]
                if len(loc) > 2 and loc[0] == "target" and loc[1] in ("job", "http"):
                    del loc[1]
                errors.setdefault(input_for(".".join(loc)), f"{'.'.join(loc)}: {problem['msg']}")
            raise FormRefused(errors) from None
