"""Flash notices: what an action did, shown once on the page the browser is sent to next.

After a POST the admin redirects (303) and must say on the next page what
happened.  A query parameter (``?done=reset``) would let anyone link to a page
that claims a reset that never happened, so the notice travels in a cookie
instead: ``<kind>.<count>.<expires>.<signature>`` signed with the admin's
secret and bound to the actor and the mount path, built from the action's
result, valid for ``FLASH_SECONDS`` and deleted by the page that shows it.
Anything else in that cookie (forged, expired, another actor's) shows nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from outboxkit.admin.signed_values import Signer
from outboxkit.clock import Clock
from outboxkit.operations.controls import DUE_COUNT_CAP

__all__ = ["FLASH_COOKIE", "FLASH_SECONDS", "Flash", "FlashNotices"]

FLASH_COOKIE = "outboxkit_flash"
FLASH_SECONDS = 60
_PURPOSE = "flash"
# What the schedule pages' actions say (outboxkit.admin.schedule_pages).
SCHEDULE_NOTICES = {
    "schedule_created": "Created. Every process fires it from its next fire time.",
    "schedule_edited": "Saved. Every process applies the change within a second.",
    "schedule_enabled": "Enabled: it fires from its next fire time after now.",
    "schedule_disabled": "Disabled: no process fires it until it is enabled (occurrences meanwhile are skipped).",
    "schedule_run_now": "Due now: the next process to look fires one occurrence, then it keeps its own times.",
    "schedule_deleted": "Deleted. Its run history and its audit stay.",
}
# What the subscription pages' actions say (outboxkit.admin.subscription_pages, subscription_replay_pages).
SUBSCRIPTION_NOTICES = {
    "subscription_created": "Created. It receives the events published from now on.",
    "subscription_edited": "Saved. Its deliveries not sent yet go to the new URL with the new headers.",
    "subscription_enabled": "Enabled. The deliveries its disable held are due now.",
    "subscription_disabled": "Disabled. Its pending deliveries are held (stuck) until it is enabled.",
    "subscription_deleted": "Deleted. Its pending deliveries are parked stuck; its events and its audit stay.",
    "subscription_rotated": "Rotated. The new secret signs every delivery from the next send (within seconds).",
    "subscription_test_sent": "A test event (outboxkit.test) is enqueued to this subscription; the next drain sends it.",
}

FlashKind = Literal[
    "reset", "retry_now", "unchanged", "reset_many", "retry_many",
    "paused", "resumed", "drain_now", "resumed_drain_now", "already", "replayed", "reset_partial",
    "destination_resumed", "destination_disabled", "destination_probed", "destination_unchanged", "skipped",
    "destination_limits_set", "destination_limits_cleared", "destination_limits_unchanged",
    "discarded", "discard_many", "discard_partial",
    "schedule_created", "schedule_edited", "schedule_enabled", "schedule_disabled", "schedule_run_now", "schedule_deleted",
    "subscription_created", "subscription_edited", "subscription_enabled", "subscription_disabled", "subscription_deleted",
    "subscription_rotated", "subscription_test_sent", "subscription_replayed",
]
_KINDS: tuple[str, ...] = (
    "reset",
    "retry_now",
    "unchanged",
    "reset_many",
    "retry_many",
    "paused",
    "resumed",
    "drain_now",
    "resumed_drain_now",
    "already",
    "replayed",
    "reset_partial",
    "destination_resumed",
    "destination_disabled",
    "destination_probed",
    "destination_unchanged",
    "skipped",
    "destination_limits_set",
    "destination_limits_cleared",
    "destination_limits_unchanged",
    "discarded",
    "discard_many",
    "discard_partial",
    *SCHEDULE_NOTICES,
    *SUBSCRIPTION_NOTICES,
    "subscription_replayed",
)


@dataclass(frozen=True, slots=True)
class Flash:
    """One notice: what kind of result, and how many rows it changed."""

    kind: FlashKind
    count: int = 0

    @property
    def message(self) -> str:
        if self.kind in SCHEDULE_NOTICES:
            return SCHEDULE_NOTICES[self.kind]
        if self.kind in SUBSCRIPTION_NOTICES:
            return SUBSCRIPTION_NOTICES[self.kind]
        if self.kind == "subscription_replayed":
            return f"Replayed: {self.count:,} past event(s) enqueued to this subscription, in publication order."
        if self.kind == "reset":
            return "Reset: the row is pending and due now; the next drain sends it."
        if self.kind == "retry_now":
            return "The row is due now; the next drain sends it."
        if self.kind == "skipped":
            return "Skipped: the row stays stuck (never deleted); the rows of its key behind it are sent now."
        if self.kind.startswith("discard"):
            return _discard_message(self.kind, self.count)
        if self.kind == "reset_many":
            return (
                f"Reset {self.count:,} row(s); they are pending and due now."
                if self.count
                else "Reset 0 row(s): none matched any more."
            )
        if self.kind == "retry_many":
            return (
                f"{self.count:,} row(s) are due now; the next drain sends them."
                if self.count
                else "0 rows changed: none was in backoff."
            )
        if self.kind == "paused":
            return "Paused: no process claims rows of this outbox until it is resumed (rows in flight finish)."
        if self.kind == "resumed":
            return "Resumed: the drains claim this outbox's due rows again, starting now."
        if self.kind == "already":
            return "Nothing to do: the outbox already was in that state."
        if self.kind == "replayed":
            return (
                f"Replayed {self.count:,} delivered row(s): they are pending and due now, with their idempotency keys."
                if self.count
                else "Replayed 0 rows: none matched any more."
            )
        if self.kind == "drain_now":
            if self.count >= DUE_COUNT_CAP:  # the count stops there
                return f"Woke every drain of this outbox; at least {DUE_COUNT_CAP:,} rows were due (the count stops there)."
            return f"Woke every drain of this outbox; {self.count:,} row(s) were due."
        if self.kind == "reset_partial":
            return (
                f"Reset {self.count:,} row(s), in batches; more rows may match: the request stopped at its time share. "
                "Reset all matching again to go on (rows already reset are not touched twice)."
            )
        if self.kind == "resumed_drain_now":
            return f"Resumed, and woke every drain of this outbox; {self.count:,} row(s) were due."
        if self.kind.startswith("destination_"):
            return _destination_message(self.kind, self.count)
        return "Nothing to do: the row was not in a state this action applies to."


def _discard_message(kind: str, count: int) -> str:
    kept = "kept, never sent, out of the stuck count; a reset brings them back"
    if kind == "discarded":
        return f"Discarded: the row is {kept.replace('them', 'it')}."
    if kind == "discard_partial":
        return (
            f"Discarded {count:,} row(s), in batches ({kept}); more rows may match: the request stopped at its time "
            "share. Discard all matching again to go on."
        )
    return f"Discarded {count:,} row(s): {kept}." if count else "Discarded 0 rows: none matched any more."


def _destination_message(kind: str, count: int) -> str:
    if kind == "destination_resumed":
        return f"Resumed: the destination is healthy; {count:,} row(s) it held back may go now."
    if kind == "destination_disabled":
        return "Disabled: nothing is sent to this destination, not even a probe, until it is resumed."
    if kind == "destination_probed":
        return f"The cool-down ends now: the next row claimed goes as the probe ({count:,} row(s) were waiting)."
    if kind == "destination_limits_set":
        return "Limits saved: every drain claims under them from its next claim (the drains are woken now)."
    if kind == "destination_limits_cleared":
        return "Limits cleared: the outbox's own limits from code and settings apply again (the drains are woken now)."
    if kind == "destination_limits_unchanged":
        return "Nothing to do: the destination's limits were these already."
    return "Nothing to do: the destination was not in a state this action applies to (its status is below)."


class FlashNotices:
    """Encodes and reads flash cookies for one admin router."""

    def __init__(self, signer: Signer, *, clock: Clock) -> None:
        self._signer = signer
        self._clock = clock

    def cookie_name(self, mount_path: str) -> str:
        return f"{FLASH_COOKIE}_{self._signer.tag(mount_path)}"

    def encode(self, flash: Flash, *, actor: str, mount_path: str) -> str:
        expires = self._clock.now() + timedelta(seconds=FLASH_SECONDS)
        return self._signer.sign(_PURPOSE, binding=(actor, mount_path), fields=(flash.kind, str(flash.count)), expires=expires)

    def decode(self, value: str | None, *, actor: str, mount_path: str) -> Flash | None:
        fields = self._signer.unsign(value, _PURPOSE, binding=(actor, mount_path), now=self._clock.now())
        if fields is None or len(fields) != 2:
            return None
        kind, count = fields
        if kind not in _KINDS or not (count.isascii() and count.isdigit()):
            return None
        return Flash(kind=kind, count=int(count))  # type: ignore[arg-type]
