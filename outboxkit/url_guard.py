"""The guard for URLs that do not come from the application's code.

A URL that a person or a program can set at runtime (a schedule's HTTP
target, through the admin, its API, the CLI or ``ScheduleStore``) could point
the kit at the application's own neighbours: the loopback interface, the
database's port, a private network, the cloud's metadata service at
169.254.169.254.  ``UrlGuard.check`` is the one place that decides whether
such a URL may be sent to, at save time and again at every send:

* the scheme is ``http`` or ``https``, the URL has a host and no user
  information (a credential in a URL would be stored and shown; a header
  value ``secret:NAME`` references one instead, see ``outboxkit.target_secrets``);
* the host is resolved (``socket.getaddrinfo``, so every form the system
  accepts, ``2130706433`` and ``0x7f.1`` included, is judged by the address
  it means), and **every** address it resolves to must be globally
  routable: loopback, private (RFC 1918), shared (100.64/10), link-local
  (169.254/16, fe80::/10), unique-local (fc00::/7), multicast, unspecified,
  reserved and documentation ranges are refused, also when written inside
  an IPv6 address (``::ffff:127.0.0.1``, ``::127.0.0.1``, 6to4, NAT64's
  ``64:ff9b::/96``);
* unless the allow-list names them: a network (``10.20.0.0/16``,
  ``127.0.0.1/32``) admits the addresses in it, a host name
  (``hooks.internal``) admits whatever that exact name resolves to.

The answer, ``CheckedUrl``, carries the address that was checked; the send
connects to that address (``Delivery.pinned_to``, honoured by
``HttpTransport``), with the URL's own host name in ``Host`` and in TLS, so a
name that resolves elsewhere a moment later (DNS rebinding) changes nothing.
Redirects are never followed by the kit's transport (a 3xx is ``stuck``).

A lookup runs on a daemon thread and is waited for at most ``timeout``
seconds, so a send's deadline holds while the resolver hangs.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from outboxkit.errors import InvalidValueError, UnsafeUrlError

__all__ = ["AllowList", "CheckedUrl", "UrlGuard"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Sequence[str]]
ALLOW_LIST_SETTING = "OUTBOXKIT_URL_ALLOW_LIST"
_SCHEMES = {"http": 80, "https": 443}
_HOST_NAME = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?")


@dataclass(frozen=True)
class AllowList:
    """Networks and exact host names the guard lets through although they are not public."""

    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        """``"127.0.0.1/32"``, ``"10.0.0.0/8"``, ``"::1"`` (a network, or one address) or ``"hooks.internal"`` (a host)."""
        networks: list[IPNetwork] = []
        hosts: set[str] = set()
        for raw in entries:
            entry = raw.strip() if isinstance(raw, str) else raw
            if not isinstance(entry, str) or not entry:
                raise InvalidValueError(f"an allow-list entry must be a network (e.g. 10.0.0.0/8) or a host name, got {raw!r}")
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            if not _HOST_NAME.fullmatch(entry) or not all(part and len(part) < 64 for part in entry.rstrip(".").split(".")):
                raise InvalidValueError(f"{entry!r} is neither a network (e.g. 10.0.0.0/8, fd00::/8) nor a host name")
            hosts.add(entry.lower().rstrip("."))
        return cls(networks=tuple(networks), hosts=frozenset(hosts))

    def admits(self, address: IPAddress) -> bool:
        return any(address in network for network in self.networks)

    def __bool__(self) -> bool:
        return bool(self.networks or self.hosts)


@dataclass(frozen=True, kw_only=True)
class CheckedUrl:
    """A URL the guard let through, and the address a send to it connects to."""

    url: str
    host: str
    port: int
    address: str


def unroutable(address: IPAddress) -> str | None:
    """Why ``address`` is not a public one (``"loopback"``, ``"private"``...), or None when it is."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and any(address in network for network in _EMBEDDING_IPV4) and int(address) > 1:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)  # IPv4-compatible, or NAT64's prefix
        if embedded is not None:
            return unroutable(embedded)
    for kind, flag in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local (cloud metadata lives there)", address.is_link_local),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
    ):
        if flag:
            if kind == "private" and isinstance(address, ipaddress.IPv6Address) and address in _UNIQUE_LOCAL:
                return "unique-local"
            return kind
    if not address.is_global:
        return "not globally routable"
    return None


_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")
_EMBEDDING_IPV4 = (ipaddress.ip_network("::/96"), ipaddress.ip_network("64:ff9b::/96"))


@dataclass(frozen=True)
class UrlGuard:
    """Checks URLs that do not come from the application's code; see the module docstring for the rules.

    ``allow`` is the allow-list (``AllowList``, or its entries as strings);
    ``resolve(host, port)`` returns the addresses a host name means (the
    system's resolver by default; tests inject one).
    """

    allow: AllowList = field(default_factory=AllowList)
    resolve: Resolver | None = field(default=None, compare=False)

    @classmethod
    def from_entries(cls, entries: Iterable[str], *, resolve: Resolver | None = None) -> UrlGuard:
        return cls(allow=AllowList.parse(entries), resolve=resolve)

    def check(self, url: str, *, timeout: float = 5.0) -> CheckedUrl:
        """The URL and the address to connect to; ``UnsafeUrlError`` (a ``ValueError``) says why it may not be used."""
        host, port = self.parse(url)
        addresses = self._addresses(url, host, port, timeout)
        if host not in self.allow.hosts:
            for address in addresses:
                reason = unroutable(address)
                if reason is not None and not self.allow.admits(address):
                    literal = str(address) == host
                    what = host if literal else f"{host} resolves to {address}, which"
                    example = f"{address}/{address.max_prefixlen}" if literal else host
                    raise UnsafeUrlError(
                        f"{_short(url)}: {what} is a {reason} address; outboxkit sends only to public addresses unless "
                        f"{ALLOW_LIST_SETTING} names its network or host (e.g. {ALLOW_LIST_SETTING}={example})"
                    )
        return CheckedUrl(url=url, host=host, port=port, address=str(addresses[0]))

    def parse(self, url: str) -> tuple[str, int]:
        """The host (lower case, IPv6 without brackets) and port of ``url``; refuses what is not plain http(s)."""
        if not isinstance(url, str) or any(character.isspace() or ord(character) < 32 for character in url):
            raise UnsafeUrlError(f"{_short(url)}: not a URL (it must be an absolute http(s) URL without spaces)")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise UnsafeUrlError(f"{_short(url)}: not a valid URL (bad port or host)") from None
        if parts.scheme.lower() not in _SCHEMES:
            raise UnsafeUrlError(f"{_short(url)}: only http:// and https:// URLs are sent, not {parts.scheme or 'none'}://")
        if "@" in parts.netloc:
            raise UnsafeUrlError(
                f"{_short(url, hide_userinfo=True)}: a URL may not hold a user name or password (it would be stored "
                "and shown); put the credential in OUTBOXKIT_SECRETS__<NAME> and send it as a header whose value is "
                "'secret:<name>', e.g. Authorization: secret:partner_token"
            )
        if not parts.hostname:
            raise UnsafeUrlError(f"{_short(url)}: the URL has no host")
        return parts.hostname.lower().rstrip("."), port if port is not None else _SCHEMES[parts.scheme.lower()]

    def _addresses(self, url: str, host: str, port: int, timeout: float) -> list[IPAddress]:
        try:
            return [ipaddress.ip_address(host)]  # a literal: no lookup (the common dotted and bracketed forms)
        except ValueError:
            pass
        try:
            found = self.resolve(host, port) if self.resolve is not None else _lookup(host, port, timeout)
        except OSError as exc:
            raise UnsafeUrlError(f"{_short(url)}: the host {host!r} does not resolve ({exc})") from None
        if found is None:
            raise UnsafeUrlError(f"{_short(url)}: the lookup of {host!r} did not finish within {timeout:g} s")
        addresses: list[IPAddress] = []
        for text in found:
            try:
                addresses.append(ipaddress.ip_address(text.split("%", 1)[0]))  # an IPv6 scope id is not part of it
            except ValueError:
                continue
        if not addresses:
            raise UnsafeUrlError(f"{_short(url)}: the host {host!r} resolves to no address")
        return addresses


def _lookup(host: str, port: int, timeout: float) -> list[str] | None:
    """The system resolver's addresses for ``host``, waited for at most ``timeout`` seconds (None: not in time)."""
    result: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            result["found"] = [info[4][0] for info in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)]
        except OSError as exc:
            result["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="outboxkit-url-guard-dns", daemon=True).start()
    if not done.wait(timeout):
        return None
    error: OSError | None = result.get("error")
    if error is not None:
        raise error
    found: list[str] = result["found"]
    return found


def _short(url: object, *, hide_userinfo: bool = False) -> str:
    text = url if isinstance(url, str) else repr(url)
    if hide_userinfo and "@" in text:
        scheme, _, rest = text.partition("://")
        text = f"{scheme}://***@{rest.split('@', 1)[1]}"
    return repr(text[:200] + ("..." if len(text) > 200 else ""))
