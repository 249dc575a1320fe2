"""The subscriptions' JSON API (in the application's OpenAPI schema beside ``outboxkit.admin.api``).

Routes, relative to where the application mounts the router::

    GET  /api/subscriptions?tenant=                  every subscription (of a tenant), by id; secrets counted
    GET  /api/subscriptions/{id}                     one, with its recent changes and its deliveries by status
    POST /api/subscriptions/new                      {url, event_types, secrets?, tenant?, headers?, description?,
                                                      rate_limit?, max_in_flight?}
    POST /api/subscriptions/{id}/edit                {url, event_types, tenant?, headers?, description?, rate_limit?,
                                                      max_in_flight?}: secrets stay; limits left out are cleared
    POST /api/subscriptions/{id}/disable             {reason}: pending deliveries held until enabled
    POST /api/subscriptions/{id}/enable              {}
    POST /api/subscriptions/{id}/delete              {}: pending deliveries parked stuck, nothing deleted but the row
    POST /api/subscriptions/{id}/rotate-secret       {secret?, keep_previous?}: the new secret, shown once
    POST /api/subscriptions/{id}/replay              {since, until?, event_types?, dry_run?}: past events enqueued again
    POST /api/subscriptions/{id}/test-event          {}: one ``outboxkit.test`` event to this subscription

Every POST takes ``application/json`` only (the API's CSRF guard), runs
through ``outboxkit.operations.subscription_admin`` and is audited with the
actor.  The URL passes the kit's URL guard (``OUTBOXKIT_URL_ALLOW_LIST``).
``rate_limit`` (requests per second) and ``max_in_flight`` (sends at once)
are the subscription's own limits, its destination's on the deliveries
outbox (``outboxkit.events.store``); null is the outbox's own.
Errors: 404 an unknown subscription, 422 a field the subscription rules
refuse (a limit out of range included), with the field as the error's ``loc`` (``["body", "url"]``), shaped as
FastAPI's own 422; nothing is written.  503 as for every admin route.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from outboxkit.admin.api import WRITE_ERRORS, ErrorBody, http_errors, require_json
from outboxkit.admin.route_guard import AdminRoute, read_json_body
from outboxkit.admin.schedule_api import inline_schema
from outboxkit.errors import InvalidSubscriptionError
from outboxkit.operations.schemas import EmptyRequest
from outboxkit.operations.subscription_admin import SubscriptionAdmin
from outboxkit.operations.subscription_schemas import (
    ReplayRequest,
    ReplayResultModel,
    RotateRequest,
    RotateResult,
    SubscriptionActionResult,
    SubscriptionCreate,
    SubscriptionDetail,
    SubscriptionDisable,
    SubscriptionFields,
    SubscriptionModel,
    TestEventResult,
)

__all__ = ["subscription_api_router", "subscription_errors", "subscription_detail"]

SubscriptionId = Annotated[int, Path(description="The subscription's id.", ge=1, le=2**63 - 1)]
_NOT_FOUND: dict[str, Any] = {"model": ErrorBody, "description": "No subscription has this id."}
_REFUSED: dict[str, Any] = {
    "description": "The body does not fit the schema, or a subscription rule refuses a field (loc names it); nothing written.",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}},
}
# The API's write errors, but no row a drain could hold (409), and refusals that name the field (422).
_WRITE_ERRORS = {**{status: answer for status, answer in WRITE_ERRORS.items() if status != 409}, 404: _NOT_FOUND, 422: _REFUSED}


@contextmanager
def subscription_errors() -> Iterator[None]:
    """A refused field as FastAPI's 422 with the field as its ``loc``; other refusals as ``http_errors``."""
    with http_errors():
        try:
            yield
        except InvalidSubscriptionError as exc:
            problem = {"type": "value_error", "loc": ("body", *exc.field.split(".")), "msg": str(exc), "input": None}
            raise RequestValidationError([problem]) from None


def subscription_detail(subscriptions: SubscriptionAdmin, subscription_id: int) -> SubscriptionDetail:
    """One subscription with its recent changes and its deliveries by status (pages and API alike)."""
    found = subscriptions.get(subscription_id)
    return SubscriptionDetail(
        subscription=found,
        changes=subscriptions.changes(subscription_id),  # type: ignore[arg-type]
        deliveries=subscriptions.deliveries(subscription_id),
    )


def subscription_api_router(
    subscriptions: SubscriptionAdmin, *, actor: Callable[..., str], route_class: type[AdminRoute] = AdminRoute
) -> APIRouter:
    """The subscriptions' JSON routes over ``subscriptions``; ``actor`` is a dependency naming who acts."""
    router = APIRouter(prefix="/api", tags=["outboxkit admin: subscriptions"], route_class=route_class)
    Actor = Annotated[str, Depends(actor)]

    @router.post(
        "/subscriptions/new", response_model=SubscriptionActionResult, responses=_WRITE_ERRORS,
        dependencies=[Depends(require_json)], openapi_extra=inline_schema(SubscriptionCreate),
        summary="Create a subscription (without secrets one is generated and shown once; 422 names a refused field)",
    )
    async def create(request: Request, who: Actor) -> SubscriptionActionResult:
        body: SubscriptionCreate = await read_json_body(request, SubscriptionCreate)
        with subscription_errors():
            created, secret = await run_in_threadpool(lambda: subscriptions.create_from(body, actor=who))
        return SubscriptionActionResult(subscription=created, secret=secret)

    @router.get("/subscriptions", response_model=list[SubscriptionModel], summary="Every subscription (of a tenant), by id")
    def subscription_list(
        tenant: Annotated[str, Query(max_length=200, description="Only this tenant's (empty or absent: every one).")] = "",
    ) -> list[SubscriptionModel]:
        with subscription_errors():
            found = subscriptions.subscriptions(tenant=tenant or None)
            return list(found)

    @router.get(
        "/subscriptions/{subscription_id:int}", response_model=SubscriptionDetail, responses={404: _NOT_FOUND},
        summary="One subscription, its recent changes and its deliveries by status",
    )
    def subscription(subscription_id: SubscriptionId) -> SubscriptionDetail:
        with subscription_errors():
            return subscription_detail(subscriptions, subscription_id)

    def action(
        path: str, name: str, summary: str, request_model: type[BaseModel], response_model: type[BaseModel],
        perform: Callable[[int, Any, str], Any],
    ) -> None:
        """A POST whose JSON body is ``request_model``, run as ``perform(subscription id, body, actor)``."""

        async def act(request: Request, who: Actor, subscription_id: SubscriptionId) -> Any:
            body = await read_json_body(request, request_model)
            with subscription_errors():
                return await run_in_threadpool(perform, subscription_id, body, who)

        router.add_api_route(
            f"/subscriptions/{{subscription_id:int}}/{path}", act, methods=["POST"], response_model=response_model,
            responses=_WRITE_ERRORS, dependencies=[Depends(require_json)], summary=summary,
            name=f"outboxkit_admin_api_subscription_{name}", openapi_extra=inline_schema(request_model),
        )

    def changed(found: Any) -> SubscriptionActionResult:
        return SubscriptionActionResult(subscription=found)

    action("edit", "edit", "Replace a subscription's definition (its secrets stay; pending deliveries follow the new URL)",
           SubscriptionFields, SubscriptionActionResult,
           lambda number, body, who: changed(subscriptions.edit(number, body, actor=who)))
    action("disable", "disable", "Disable a subscription with a reason (its pending deliveries held until enabled)",
           SubscriptionDisable, SubscriptionActionResult,
           lambda number, body, who: changed(subscriptions.disable(number, reason=body.reason, actor=who)))
    action("enable", "enable", "Enable a subscription (the deliveries its disable held are due now)",
           EmptyRequest, SubscriptionActionResult,
           lambda number, body, who: changed(subscriptions.enable(number, actor=who)))
    def delete(number: int, body: EmptyRequest, who: str) -> SubscriptionActionResult:
        subscriptions.delete(number, actor=who)
        return SubscriptionActionResult(subscription=None)

    action("delete", "delete", "Delete a subscription (its pending deliveries end stuck; its events and audit stay)",
           EmptyRequest, SubscriptionActionResult, delete)

    def rotate(number: int, body: RotateRequest, who: str) -> RotateResult:
        found, secret = subscriptions.rotate(number, actor=who, secret=body.secret, keep_previous=body.keep_previous)
        return RotateResult(subscription=found, secret=secret)

    action("rotate-secret", "rotate_secret", "Rotate the signing secret (the new one is shown once)",
           RotateRequest, RotateResult, rotate)

    def replay(number: int, body: ReplayRequest, who: str) -> ReplayResultModel:
        result = subscriptions.replay(
            number, since=body.since, until=body.until, event_types=body.event_types, dry_run=body.dry_run, actor=who
        )
        return ReplayResultModel.model_validate(result)

    action("replay", "replay", "Enqueue stored past events again to this subscription (dry_run counts them only)",
           ReplayRequest, ReplayResultModel, replay)
    action("test-event", "test_event", "Send one outboxkit.test event to this subscription",
           EmptyRequest, TestEventResult,
           lambda number, body, who: TestEventResult(subscription_id=number,
                                                     event_id=subscriptions.send_test(number, actor=who)))
    return router
