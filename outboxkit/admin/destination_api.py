"""The admin's JSON API for destinations (documented in the application's OpenAPI schema).

Routes, relative to where the application mounts the router::

    GET  /api/destinations                                 every outbox's destinations, those needing a person first
    GET  /api/outboxes/{outbox}/destinations               one outbox's
    GET  /api/outboxes/{outbox}/destination?name=          one destination (404 when it has no state)
    POST /api/outboxes/{outbox}/destinations/resume        {"destination": ...}: healthy again, its held rows may go
    POST /api/outboxes/{outbox}/destinations/disable       {"destination": ...}: nothing sent to it until resumed
    POST /api/outboxes/{outbox}/destinations/probe         {"destination": ...}: an open breaker's cool-down ends now
    GET  /api/outboxes/{outbox}/destination/limits?name=   its limits: an operator's, and the outbox's own
    POST /api/outboxes/{outbox}/destinations/limits        {"destination": ..., "per_second": ..., "cap": ...}: set both
                                                           (null: the outbox's own; both null clears them)

The name is a query parameter or a body field: destination names are URLs or
an outbox's own names.  Actions take a JSON body only (the API's CSRF guard,
as for the other actions), are audited with the actor, and answer
``changed: false`` with a ``reason`` when there was nothing to do.  Errors:
404 unknown outbox or destination (nothing changed), 415 a body that is not
JSON, 422 a malformed body or a bad limit (not a number, zero, negative, too
large; nothing changed), 503 as for every admin route.
"""

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from outboxkit.admin.api import READ_ERRORS, WRITE_ERRORS, OutboxName, http_errors, json_body, require_json
from outboxkit.admin.route_guard import AdminRoute, read_json_body
from outboxkit.operations.destination_limits import DestinationLimitsModel, DestinationLimitsRequest, DestinationLimitsResult
from outboxkit.operations.destinations import (
    DestinationActionRequest,
    DestinationActionResult,
    DestinationModel,
    DestinationsView,
    OutboxDestinations,
)
from outboxkit.operations.service import OperationsService

__all__ = ["destination_api_router"]

_UNKNOWN: dict[int | str, dict[str, Any]] = {
    404: {**READ_ERRORS[404], "description": "Unknown outbox or destination; nothing was changed."}
}


def destination_api_router(
    service: OperationsService, *, actor: Callable[..., str], route_class: type[AdminRoute] = AdminRoute
) -> APIRouter:
    """The destination routes over ``service.destinations``; ``actor`` is a dependency naming who acts."""
    router = APIRouter(prefix="/api", tags=["outboxkit admin"], route_class=route_class)
    operations = service.destinations
    Actor = Annotated[str, Depends(actor)]

    @router.get("/destinations", response_model=DestinationsView, summary="Every outbox's destinations, needing a person first")
    def destinations() -> DestinationsView:
        return operations.all()

    @router.get(
        "/outboxes/{outbox}/destinations", response_model=OutboxDestinations, responses=_UNKNOWN,
        summary="One outbox's destinations",
    )
    def outbox_destinations(outbox: OutboxName) -> OutboxDestinations:
        with http_errors():
            return operations.of_outbox(outbox)

    @router.get(
        "/outboxes/{outbox}/destination", response_model=DestinationModel, responses=_UNKNOWN, summary="One destination"
    )
    def destination(
        outbox: OutboxName, name: Annotated[str, Query(min_length=1, max_length=300, description="The destination's name.")]
    ) -> DestinationModel:
        with http_errors():
            return operations.one(outbox, name)

    def action(name: str, summary: str, perform: Callable[..., DestinationActionResult]) -> None:
        async def act(request: Request, outbox: OutboxName, who: Actor) -> DestinationActionResult:
            body: DestinationActionRequest = await read_json_body(request, DestinationActionRequest)
            with http_errors():
                return await run_in_threadpool(lambda: perform(outbox, body.destination, actor=who))

        router.add_api_route(
            f"/outboxes/{{outbox}}/destinations/{name}",
            act,
            methods=["POST"],
            response_model=DestinationActionResult,
            responses={**WRITE_ERRORS, **_UNKNOWN},
            dependencies=[Depends(require_json)],
            summary=summary,
            name=f"outboxkit_admin_api_destination_{name}",
            openapi_extra=json_body(DestinationActionRequest),
        )

    limits = service.destination_limits

    @router.get(
        "/outboxes/{outbox}/destination/limits", response_model=DestinationLimitsModel, responses=_UNKNOWN,
        summary="One destination's limits: an operator's, and the outbox's own",
    )
    def destination_limits(
        outbox: OutboxName, name: Annotated[str, Query(min_length=1, max_length=300, description="The destination's name.")]
    ) -> DestinationLimitsModel:
        with http_errors():
            return limits.get(outbox, name)

    @router.post(
        "/outboxes/{outbox}/destinations/limits", response_model=DestinationLimitsResult,
        responses={**WRITE_ERRORS, **_UNKNOWN}, dependencies=[Depends(require_json)],
        summary="Set a destination's rate limit and cap while the kit runs (null: the outbox's own; audited)",
        openapi_extra=json_body(DestinationLimitsRequest),
    )
    async def set_destination_limits(request: Request, outbox: OutboxName, who: Actor) -> DestinationLimitsResult:
        body: DestinationLimitsRequest = await read_json_body(request, DestinationLimitsRequest)
        with http_errors():
            return await run_in_threadpool(
                lambda: limits.set(outbox, body.destination, per_second=body.per_second, cap=body.cap, actor=who)
            )

    action("resume", "Resume a destination: healthy again, the rows it held back may go now (audited)", operations.resume)
    action("disable", "Disable a destination: nothing is sent to it, not even a probe, until resumed (audited)",
           operations.disable)
    action("probe", "Probe a destination now: an open breaker's cool-down ends, the next row goes as the probe (audited)",
           operations.probe)
    return router
