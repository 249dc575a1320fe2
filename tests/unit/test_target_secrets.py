"""The credential rules of HTTP targets (outboxkit.target_secrets): what is refused, resolved and redacted."""

from __future__ import annotations

import pytest

from outboxkit.target_secrets import credential_problem, redact_headers, redact_url, resolve_headers


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ({"Authorization": "Bearer abc"}, "may not hold a credential in clear"),
        ({"COOKIE": "sid=1"}, "may not hold a credential in clear"),
        ({"Authorization": "secret:nope"}, "OUTBOXKIT_SECRETS__NOPE"),
        ({"X-Key": "secret:Not A Name"}, "is not a secret reference"),
        ({"X-Api-Key": "[redacted]"}, "its value is not shown"),
    ],
)
def test_a_literal_credential_an_unknown_reference_and_a_redacted_value_are_refused(headers, problem):
    assert problem in (credential_problem(headers, {"token"}) or "")


def test_references_to_known_secrets_and_other_headers_pass():
    assert credential_problem({"Authorization": "SECRET:Token", "X-Source": "shop"}, {"token"}) is None


def test_references_are_resolved_and_a_missing_one_is_named():
    assert resolve_headers({"Authorization": "secret:token", "X-A": "1"}, {"token": "Bearer t"}) == (
        {"Authorization": "Bearer t", "X-A": "1"}, None
    )
    assert "OUTBOXKIT_SECRETS__GONE" in (resolve_headers({"Authorization": "secret:gone"}, {})[1] or "")


def test_what_is_shown_hides_credential_values_and_userinfo_but_not_references():
    assert redact_headers({"Authorization": "Bearer t", "X-Api-Key": "k", "X-Token": "secret:token", "X-A": "1"}) == {
        "Authorization": "[redacted]", "X-Api-Key": "[redacted]", "X-Token": "secret:token", "X-A": "1"
    }
    assert redact_url("https://user:pw@partner.test:8443/a?b=c@d") == "https://***@partner.test:8443/a?b=c@d"
    assert redact_url("https://partner.test/a@b") == "https://partner.test/a@b"
