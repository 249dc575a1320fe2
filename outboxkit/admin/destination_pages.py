"""The admin's destination pages: every destination of every outbox, one destination, and resume, disable, probe now.

::

    GET  /destinations                                  every outbox's destinations, those needing a person first
    GET  /outboxes/{outbox}/destination?name=           one destination: state, failures, rows waiting, actions
    POST /outboxes/{outbox}/destination/resume          form: destination (CSRF)
    POST /outboxes/{outbox}/destination/probe           form: destination (CSRF)
    GET  /outboxes/{outbox}/destination/disable?name=   asks first (changes nothing); its form posts the disable
    POST /outboxes/{outbox}/destination/disable         form: destination (CSRF)
    POST /outboxes/{outbox}/destination/limits          form: destination, per_second, cap (blank: the outbox's own; CSRF)

The name travels as a query or form field, not in the path: a destination's
name is a URL (``https://billing.internal:443``) or whatever the outbox named
it.  Resume and probe act at once (they lose nothing: rows flow again, or one
goes as a probe), as "Resume drains" does; disable asks first, as "Pause
drains" does, since it stops every send to a receiver.  The actions follow
the pages' discipline (``outboxkit.admin.page_frame``): CSRF checked before
anything is read, a 303 back to the destination's page with a signed flash
notice, refusals (an unknown outbox or destination: 404) as the error page.
The limits form sets both limits at once (``outboxkit.operations.destination_limits``):
a blank field is the outbox's own, so blanking both clears them; a value that
is not a positive number (or, for the cap, a whole one) is refused (422) and
changes nothing.
"""


# No ``from __future__ import annotations``: FastAPI reads each route's ``Actor`` annotation at runtime.
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Query, Request
from fastapi.responses import Response
from starlette.datastructures import FormData

from outboxkit.admin.api import OutboxName
from outboxkit.admin.confirm_pages import render_confirm
from outboxkit.admin.flash import Flash, FlashKind
from outboxkit.admin.page_frame import PageRoutes
from outboxkit.admin.page_inputs import form_text
from outboxkit.errors import PageInputError
from outboxkit.operations.destination_limits import limit_from_text
from outboxkit.operations.destinations import DestinationActionResult

__all__ = ["add_destination_pages"]

DestinationName = Annotated[str, Query(max_length=300, description="The destination's name, as listed.")]
Act = Callable[..., DestinationActionResult]  # DestinationOperations.resume, .disable or .probe: (outbox, name, *, actor)
_DONE: dict[str, FlashKind] = {"resume": "destination_resumed", "disable": "destination_disabled", "probe": "destination_probed"}


def add_destination_pages(routes: PageRoutes) -> None:
    """The destinations list, one destination's page, its actions and the disable confirmation."""
    operations = routes.service.destinations
    add_destination_list(routes)
    add_destination_detail(routes)
    add_destination_action(routes, "resume", operations.resume)
    add_destination_action(routes, "probe", operations.probe)
    add_destination_action(routes, "disable", operations.disable)
    add_disable_confirm(routes)
    add_destination_limits(routes)


def add_destination_list(routes: PageRoutes) -> None:
    frame, operations = routes.frame, routes.service.destinations
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/destinations", name="outboxkit_admin_destinations")
    def destinations(request: Request, who: Actor) -> Response:
        return frame.guarded(request, who, lambda: frame.render(request, who, "destinations.html", view=operations.all()))


def add_destination_detail(routes: PageRoutes) -> None:
    frame, operations = routes.frame, routes.service.destinations
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/outboxes/{outbox}/destination", name="outboxkit_admin_destination")
    def destination(request: Request, outbox: OutboxName, who: Actor, name: DestinationName = "") -> Response:
        def build() -> Response:
            found = operations.one(outbox, name)  # UnknownOutboxError, UnknownDestinationError: 404
            limits = routes.service.destination_limits.get(outbox, name)
            return frame.render(request, who, "destination.html", destination=found, limits=limits)

        return frame.guarded(request, who, build)


def _destination_field(form: FormData) -> str:
    name = form_text(form, "destination") or ""
    if not name or len(name) > 300:
        raise PageInputError("bad form: destination must be a destination's name, as listed (1 to 300 characters)")
    return name


def add_destination_action(routes: PageRoutes, action: str, perform: Act) -> None:
    """A button on a destination's page: ``perform`` on it, then back to its page with the result."""
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    async def act(request: Request, outbox: OutboxName, who: Actor) -> Response:
        def build(form: FormData) -> Response:
            name = _destination_field(form)
            result = perform(outbox, name, actor=who)
            flash = Flash(kind=_DONE[action] if result.changed else "destination_unchanged", count=result.released_rows)
            return frame.redirect(request, who, frame.url(request, "destination", {"name": name}, outbox=outbox), flash)

        return await frame.post_action(request, who, build)

    routes.router.add_api_route(
        f"/outboxes/{{outbox}}/destination/{action}", act, methods=["POST"], name=f"outboxkit_admin_destination_{action}"
    )


def add_disable_confirm(routes: PageRoutes) -> None:
    """"Disable…" asks first: what disabling does, with the destination's rows waiting; its form posts the disable."""
    frame, operations = routes.frame, routes.service.destinations
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/outboxes/{outbox}/destination/disable", name="outboxkit_admin_destination_disable_confirm")
    def disable_confirm(request: Request, outbox: OutboxName, who: Actor, name: DestinationName = "") -> Response:
        def build() -> Response:
            found = operations.one(outbox, name)
            waiting = f"{found.waiting_rows:,}{'+' if found.waiting_rows_at_least else ''}"
            return render_confirm(
                frame, request, who,
                heading=f"Disable {found.name} in {outbox}?",
                explanation=[
                    "Nothing will be sent to this destination, not even a probe, by any process, until a person resumes "
                    "it. Its rows stay pending with their attempts; none is lost.",
                    f"Now: {found.status.replace('_', '-')}, {found.consecutive_failures:,} consecutive failure(s), "
                    f"{waiting} row(s) waiting.",
                ],
                action=frame.url(request, "destination_disable", outbox=outbox),
                fields=[("destination", found.name)],
                button="Disable destination",
                cancel=frame.url(request, "destination", {"name": found.name}, outbox=outbox),
            )

        return frame.guarded(request, who, build)


def add_destination_limits(routes: PageRoutes) -> None:
    """The limits form on a destination's page: both limits set at once, then back to its page."""
    frame, limits = routes.frame, routes.service.destination_limits
    Actor = Annotated[str, Depends(routes.actor)]

    async def set_limits(request: Request, outbox: OutboxName, who: Actor) -> Response:
        def build(form: FormData) -> Response:
            name = _destination_field(form)
            per_second = limit_from_text(form_text(form, "per_second"), "rate limit (requests per second)", whole=False)
            cap = limit_from_text(form_text(form, "cap"), "cap (sends in flight)", whole=True)
            result = limits.set(outbox, name, per_second=per_second, cap=cap, actor=who)
            kind: FlashKind = (
                "destination_limits_unchanged" if not result.changed
                else "destination_limits_cleared" if result.action == "destination_limit_clear"
                else "destination_limits_set"
            )
            back = frame.url(request, "destination", {"name": name}, outbox=outbox)
            return frame.redirect(request, who, back, Flash(kind=kind))

        return await frame.post_action(request, who, build)

    routes.router.add_api_route(
        "/outboxes/{outbox}/destination/limits", set_limits, methods=["POST"], name="outboxkit_admin_destination_limits"
    )
