"""Credentials of HTTP targets: referenced from the settings by name, never stored or shown in clear.

A schedule's HTTP target is data that the admin, its API, the CLI and the
audit show to every operator, so it holds no credential.  A header value
``secret:NAME`` stands for the setting ``OUTBOXKIT_SECRETS__NAME``
(``OutboxKitSettings.secrets``), which the kit's guarded transport puts in
its place at send time (``outboxkit.transports.guarded``); the stored row, its
audit and the outbox row it fires hold the name only.

* ``credential_problem`` is the rule at save time: a literal value of
  ``Authorization``, ``Proxy-Authorization`` or ``Cookie`` is refused, and a
  reference must name a secret the settings hold;
* ``resolve_headers`` replaces the references at send time;
* ``redact_headers``, ``redact_url`` and the SQL of ``redacted_headers_sql``
  and ``redacted_url_sql`` are what is shown of a target or of a fired row
  stored before these rules (or written by hand): the value of a header
  whose name says it carries a credential (``Authorization``, ``Cookie``,
  ``X-Api-Key``, ``...-Token``...) as ``[redacted]`` unless it is a
  reference, and a URL's user information as ``***``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

__all__ = [
    "REDACTED",
    "SECRET_PREFIX",
    "credential_problem",
    "redact_headers",
    "redact_url",
    "redacted_headers_sql",
    "redacted_url_sql",
    "resolve_headers",
    "secret_variable",
]

SECRET_PREFIX = "secret:"
REDACTED = "[redacted]"
SECRET_NAME = re.compile(r"[a-z0-9_]{1,64}")
# Headers whose literal value is refused at save time.
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
# Header names whose value is redacted wherever it is shown (unless it is a reference).
_SENSITIVE = r"auth|token|secret|key|password|passwd|cookie|session|signature|credential"
_SENSITIVE_NAME = re.compile(_SENSITIVE, re.IGNORECASE)
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")


def secret_variable(name: str) -> str:
    return f"OUTBOXKIT_SECRETS__{name.upper()}"


def _reference(value: str) -> str | None:
    """The secret a header value names (lower case), or None when it is a literal."""
    if value[: len(SECRET_PREFIX)].lower() != SECRET_PREFIX:
        return None
    return value[len(SECRET_PREFIX) :].strip().lower()


def credential_problem(headers: Mapping[str, str], known: Collection[str]) -> str | None:
    """Why these target headers may not be stored, or None.  ``known``: the names of the settings' secrets."""
    for name, value in headers.items():
        secret = _reference(value)
        if value == REDACTED:
            return (
                f"{name!r} is shown as {REDACTED!r} because its value is not shown; reference a secret "
                f"('{name}: secret:<name>', set as OUTBOXKIT_SECRETS__<NAME>) or type the value again"
            )
        if secret is None:
            if name.lower() in CREDENTIAL_HEADERS:
                return (
                    f"{name!r} may not hold a credential in clear (it would be stored and shown to every operator); "
                    f"set it as OUTBOXKIT_SECRETS__<NAME>=<value> and write the header as '{name}: secret:<name>'"
                )
            continue
        if not SECRET_NAME.fullmatch(secret):
            return f"{name!r}: {value[:80]!r} is not a secret reference; write 'secret:<name>' with 1-64 of a-z, 0-9, _"
        if secret not in known:
            return (
                f"{name!r} references the secret {secret!r}, which the settings do not hold; set "
                f"{secret_variable(secret)}=<value> (the value the header is sent with, e.g. 'Bearer ...')"
            )
    return None


def resolve_headers(headers: Mapping[str, str], secrets: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """The headers with each ``secret:NAME`` replaced by its value, and why not (a missing secret) or None."""
    resolved: dict[str, str] = {}
    for name, value in headers.items():
        secret = _reference(value)
        if secret is None:
            resolved[name] = value
            continue
        found = secrets.get(secret)
        if found is None:
            variable = secret_variable(secret)
            return {}, f"header {name!r} references the secret {secret!r}, which the settings do not hold ({variable})"
        resolved[name] = found
    return resolved, None


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` as shown: a credential-looking header's literal value replaced by ``[redacted]``."""
    return {
        name: REDACTED if _SENSITIVE_NAME.search(name) and _reference(str(value)) is None else value
        for name, value in headers.items()
    }


def redact_url(url: str) -> str:
    """``url`` as shown: its user information (a name and password) as ``***``."""
    return _USERINFO.sub(r"\1***@", url)


def redacted_headers_sql(column: str) -> str:
    """SQL for a JSONB headers column (quoted ``column``) as ``redact_headers`` shows it (no braces: it goes
    through ``str.format`` with the admin's other statements)."""
    return (
        f"CASE WHEN jsonb_typeof({column}) = 'object' THEN (SELECT coalesce(jsonb_object_agg(key, CASE "
        f"WHEN key ~* '{_SENSITIVE}' AND CAST(value AS text) NOT ILIKE '\"{SECRET_PREFIX}%' "
        f"THEN to_jsonb(CAST('{REDACTED}' AS text)) ELSE value END), jsonb_build_object()) FROM jsonb_each({column})) "
        f"ELSE {column} END"
    )


def redacted_url_sql(column: str) -> str:
    """SQL for a text URL column (quoted ``column``) as ``redact_url`` shows it."""
    return f"regexp_replace({column}, '^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@', '\\1***@')"
