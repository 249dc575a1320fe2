"""The replay page: past events sent again to one subscription, counted first.

::

    GET  /subscriptions/{id}/replay?since=&until=&event_types=   the form; with ``since`` it counts the matching
                                                                 events (a dry run: nothing written) and offers
                                                                 the replay of exactly that filter
    POST /subscriptions/{id}/replay                              form: since, until, event_types; the replay

A replay enqueues one new delivery per stored event that the subscription's
own filters and tenant match in the time range (``outboxkit.events.replay``),
audited.  The POST follows the pages' discipline (CSRF first, a 303 back to
the subscription with the count in the notice); a refusal (a range the wrong
way round, too many events, a disabled subscription) is the error page, and
nothing is written.
"""


# No ``from __future__ import annotations``: FastAPI reads each route's ``Actor`` annotation at runtime.
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.responses import Response
from starlette.datastructures import FormData

from outboxkit.admin.flash import Flash
from outboxkit.admin.page_frame import PageRoutes
from outboxkit.admin.page_inputs import form_text
from outboxkit.errors import InvalidSubscriptionError, PageInputError
from outboxkit.operations.subscription_admin import SubscriptionAdmin

__all__ = ["add_subscription_replay"]

SubscriptionId = Annotated[int, Path(ge=1, le=2**63 - 1)]


def _moment(value: str | None, what: str, *, required: bool) -> datetime | None:
    if not value or not value.strip():
        if required:
            raise PageInputError(f"{what} is required: a time with its offset, e.g. 2026-12-01T00:00:00+00:00")
        return None
    text = value.strip().replace("Z", "+00:00")
    try:
        moment = datetime.fromisoformat(text) if text.isascii() and len(text) <= 40 else None
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise PageInputError(f"{what} must be a time with its offset, e.g. 2026-12-01T00:00:00+00:00; got {value[:40]!r}")
    return moment


def _since(value: str | None) -> datetime:
    moment = _moment(value, "since", required=True)
    assert moment is not None  # required: _moment raised otherwise
    return moment


def _filters(value: str | None) -> list[str] | None:
    found = [entry.strip() for entry in (value or "").replace(",", "\n").splitlines() if entry.strip()]
    return found or None


def add_subscription_replay(routes: PageRoutes, subscriptions: SubscriptionAdmin) -> None:
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/subscriptions/{subscription_id}/replay", name="outboxkit_admin_subscription_replay_form")
    def replay_form(
        request: Request, subscription_id: SubscriptionId, who: Actor,
        since: str | None = None, until: str | None = None, event_types: str | None = None,
    ) -> Response:
        def build() -> Response:
            found = subscriptions.get(subscription_id)
            counted, up_to = None, until or ""
            if since:
                # The range counted is the range the replay button sends: "until" pinned to this moment when empty.
                moment = _moment(until, "until", required=False) or frame.service.kit.clock.now()
                up_to = moment.isoformat()
                try:
                    counted = subscriptions.replay(
                        subscription_id, since=_since(since), until=moment, event_types=_filters(event_types),
                        dry_run=True, actor=who,
                    )
                except InvalidSubscriptionError as exc:
                    raise PageInputError(str(exc)) from None
            return frame.render(
                request, who, "subscription_replay.html", found=found, counted=counted,
                values={"since": since or "", "until": up_to, "event_types": event_types or ""},
            )

        return frame.guarded(request, who, build)

    async def replay(request: Request, subscription_id: SubscriptionId, who: Actor) -> Response:
        def build(form: FormData) -> Response:
            try:
                result = subscriptions.replay(
                    subscription_id, since=_since(form_text(form, "since")),
                    until=_moment(form_text(form, "until"), "until", required=False),
                    event_types=_filters(form_text(form, "event_types")), dry_run=False, actor=who,
                )
            except InvalidSubscriptionError as exc:
                raise PageInputError(str(exc)) from None
            target = frame.url(request, "subscription", subscription_id=subscription_id)
            return frame.redirect(request, who, target, Flash(kind="subscription_replayed", count=result.enqueued))

        return await frame.post_action(request, who, build)

    routes.router.add_api_route(
        "/subscriptions/{subscription_id}/replay", replay, methods=["POST"], name="outboxkit_admin_subscription_replay"
    )
