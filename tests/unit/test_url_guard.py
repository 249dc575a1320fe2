"""``UrlGuard``: which URLs that do not come from code may be sent to, and the address a send connects to.

Only 127.0.0.1 and literal addresses are used: a name is resolved by an
injected resolver (or the system's hosts file, for ``localhost`` and the
integer forms, which ``getaddrinfo`` turns into 127.0.0.1 without a query).
"""

from __future__ import annotations

import pytest

from outboxkit.errors import UnsafeUrlError
from outboxkit.url_guard import AllowList, UrlGuard

PUBLIC = "93.184.216.34"


def resolver(table: dict[str, list[str]]):
    def resolve(host: str, port: int) -> list[str]:
        return table[host]

    return resolve


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:5432/", "loopback"),
        ("http://localhost:8000/admin", "loopback"),
        ("http://2130706433/", "loopback"),  # the integer form of 127.0.0.1
        ("http://0x7f.1/", "loopback"),
        ("http://[::1]/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://0.0.0.0:8080/", "unspecified"),
        ("http://10.1.2.3/", "private"),
        ("http://172.16.0.1/", "private"),
        ("http://192.168.1.1/", "private"),
        ("http://100.64.0.1/", "not globally routable"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://[fd00::1]/", "unique-local"),
        ("http://224.0.0.1/", "multicast"),
        ("http://240.0.0.1/", "reserved"),
        ("http://[2002:7f00:1::]/", "loopback"),  # 6to4 around 127.0.0.1
        ("http://[::127.0.0.1]/", "loopback"),  # IPv4-compatible
        ("http://[64:ff9b::a9fe:a9fe]/", "link-local"),  # NAT64 around 169.254.169.254
    ],
)
def test_a_non_public_address_is_refused_with_the_reason_and_the_setting_to_allow_it(url, reason):
    with pytest.raises(UnsafeUrlError, match=f"is a {reason}.*OUTBOXKIT_URL_ALLOW_LIST"):
        UrlGuard().check(url)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://93.184.216.34/file", "only http:// and https://"),
        ("file:///etc/passwd", "only http:// and https://"),
        ("gopher://93.184.216.34:70/", "only http:// and https://"),
        ("http:///path", "no host"),
        ("http://93.184.216.34:99999/", "bad port"),
        ("http://user:pw@93.184.216.34/", "may not hold a user name or password"),
    ],
)
def test_a_url_that_is_not_plain_http_is_refused(url, problem):
    with pytest.raises(UnsafeUrlError, match=problem):
        UrlGuard().check(url)


def test_the_refusal_of_userinfo_never_repeats_the_password():
    with pytest.raises(UnsafeUrlError) as refused:
        UrlGuard().check("https://admin:hunter2@93.184.216.34/")
    assert "hunter2" not in str(refused.value) and "secret:" in str(refused.value)


def test_a_name_is_judged_by_every_address_it_resolves_to():
    guard = UrlGuard(resolve=resolver({"mixed.test": [PUBLIC, "10.0.0.7"]}))
    with pytest.raises(UnsafeUrlError, match="mixed.test resolves to 10.0.0.7, which is a private address"):
        guard.check("https://mixed.test/hook")


def test_a_name_that_does_not_resolve_is_refused():
    def failing(host: str, port: int) -> list[str]:
        raise OSError("Name or service not known")

    with pytest.raises(UnsafeUrlError, match="does not resolve"):
        UrlGuard(resolve=failing).check("https://nowhere.test/")


def test_a_public_address_passes_and_the_answer_names_the_address_to_connect_to():
    guard = UrlGuard(resolve=resolver({"partner.test": [PUBLIC]}))
    checked = guard.check("https://Partner.test/hook")
    assert (checked.host, checked.port, checked.address) == ("partner.test", 443, PUBLIC)
    assert UrlGuard().check("http://93.184.216.34:8080/").address == PUBLIC


def test_the_allow_list_admits_a_network_or_an_exact_host_name():
    guard = UrlGuard.from_entries(["127.0.0.1/32", "hooks.internal"], resolve=resolver({"hooks.internal": ["10.9.8.7"]}))
    assert guard.check("http://127.0.0.1:9/ping").address == "127.0.0.1"
    assert guard.check("http://hooks.internal/x").address == "10.9.8.7"
    with pytest.raises(UnsafeUrlError, match="127.0.0.2 is a loopback"):
        guard.check("http://127.0.0.2/")


@pytest.mark.parametrize("entry", ["", "10.0.0.0/33", "not a host", "http://x/"])
def test_a_bad_allow_list_entry_is_refused(entry):
    with pytest.raises(ValueError):
        AllowList.parse([entry])
