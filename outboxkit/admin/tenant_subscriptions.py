"""``create_tenant_router``: the subscriptions API a SaaS mounts for its own customers, each scoped to one tenant.

::

    def current_customer(request: Request) -> str:
        ...authenticate, raise HTTPException(401) if not...
        return customer_id

    app.include_router(create_tenant_router(kit, tenant=current_customer), prefix="/webhooks")

Routes, relative to where the application mounts it (JSON only, ``application/json`` bodies)::

    GET  /subscriptions                                   the tenant's subscriptions
    POST /subscriptions                                   {url, event_types, secrets?, headers?, description?,
                                                           rate_limit?, max_in_flight?}
    GET  /subscriptions/{id}                              one
    POST /subscriptions/{id}/edit                         {url, event_types, headers?, description?, rate_limit?,
                                                           max_in_flight?}: limits left out are cleared
    POST /subscriptions/{id}/disable                      {reason}
    POST /subscriptions/{id}/enable                       {}
    POST /subscriptions/{id}/delete                       {}
    POST /subscriptions/{id}/rotate-secret                {secret?, keep_previous?}: the new secret, once
    POST /subscriptions/{id}/test-event                   {}
    GET  /subscriptions/{id}/deliveries                   its deliveries, newest first (limit 1..200)
    POST /subscriptions/{id}/deliveries/{event_id}/resend {}: that event sent again to this subscription

``tenant`` is a FastAPI dependency the application supplies: it authenticates
the caller and returns its tenant; it is required, so the router cannot be
mounted unscoped.  Every subscription a tenant creates carries its tenant
(the bodies have no tenant field: one sent is refused, 422).  A subscription
of another tenant, or of none, is answered 404 exactly as one that does not
exist, before anything is read or changed, so a tenant can neither see nor
touch another's rows, nor learn that they exist.  Changes are audited with the
actor ``tenant:<tenant>`` (or what ``actor`` returns) and go through the same
rules as the admin's (``outboxkit.operations.subscription_admin``): the URL
guard, the secrets' form, the headers', the limits' range.  A tenant may
throttle its own endpoint (``rate_limit`` in requests per second,
``max_in_flight``): they are its subscription's destination's limits, the
same row an operator's limits of that destination change.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from outboxkit.admin.api import require_json
from outboxkit.admin.route_guard import admin_route_class, read_json_body
from outboxkit.admin.schedule_api import inline_schema
from outboxkit.admin.subscription_api import subscription_errors
from outboxkit.errors import ConfigurationError, UnknownSubscriptionError
from outboxkit.kit import OutboxKit
from outboxkit.operations.schemas import EmptyRequest
from outboxkit.operations.subscription_admin import SubscriptionAdmin
from outboxkit.operations.subscription_schemas import (
    DeliveryModel,
    RotateRequest,
    RotateResult,
    SubscriptionActionResult,
    SubscriptionCreate,
    SubscriptionDisable,
    SubscriptionFields,
    SubscriptionModel,
    TenantSubscriptionCreate,
    TenantSubscriptionFields,
    TestEventResult,
)

__all__ = ["create_tenant_router"]

SubscriptionId = Annotated[int, Path(description="The subscription's id.", ge=1, le=2**63 - 1)]
EventId = Annotated[int, Path(description="The event's id, as its deliveries show it.", ge=1, le=2**63 - 1)]


def create_tenant_router(
    kit: OutboxKit,
    *,
    tenant: Callable[..., str],
    actor: Callable[..., str] | None = None,
    include_in_schema: bool = True,
) -> APIRouter:
    """The tenant-scoped subscriptions API; see the module docstring.  ``tenant`` is required."""
    if not callable(tenant):
        raise ConfigurationError("create_tenant_router needs tenant=<a FastAPI dependency returning the caller's tenant>")
    subscriptions = SubscriptionAdmin(kit)
    router = APIRouter(
        tags=["webhook subscriptions"], include_in_schema=include_in_schema,
        route_class=admin_route_class(max_body_bytes=kit.settings.admin_max_body_bytes),
    )

    def scoped_tenant(owner: Annotated[object, Depends(tenant)]) -> str:
        # An empty tenant would read as "no tenant": every untenanted subscription.  Refused, never widened.
        if not isinstance(owner, str) or not owner:
            raise HTTPException(status_code=403, detail="no tenant: the request is not scoped to a tenant")
        return owner

    Tenant = Annotated[str, Depends(scoped_tenant)]

    def who(owner: Tenant) -> str:
        return f"tenant:{owner}"

    Actor = Annotated[str, Depends(actor or who)]

    def owned(subscription_id: int, owner: str) -> Any:
        """The subscription if ``owner``'s; another tenant's (or none's) is as unknown as a missing one."""
        found = subscriptions.get(subscription_id)
        if found.tenant != owner:
            raise UnknownSubscriptionError(f"no subscription with id {subscription_id!r}")
        return found

    @contextmanager
    def answers() -> Iterator[None]:
        with subscription_errors():
            yield

    @router.get("/subscriptions", response_model=list[SubscriptionModel], summary="Your subscriptions")
    def subscription_list(owner: Tenant) -> list[Any]:
        with answers():
            return list(subscriptions.subscriptions(tenant=owner))

    @router.post(
        "/subscriptions", response_model=SubscriptionActionResult, dependencies=[Depends(require_json)],
        openapi_extra=inline_schema(TenantSubscriptionCreate),
        summary="Subscribe an endpoint (without secrets one is generated and shown once)",
    )
    async def create(request: Request, owner: Tenant, by: Actor) -> SubscriptionActionResult:
        body: TenantSubscriptionCreate = await read_json_body(request, TenantSubscriptionCreate)
        fields = SubscriptionCreate(**body.model_dump(), tenant=owner)
        with answers():
            created, secret = await run_in_threadpool(lambda: subscriptions.create_from(fields, actor=by))
        return SubscriptionActionResult(subscription=created, secret=secret)

    @router.get("/subscriptions/{subscription_id:int}", response_model=SubscriptionModel, summary="One of your subscriptions")
    def subscription(subscription_id: SubscriptionId, owner: Tenant) -> Any:
        with answers():
            return owned(subscription_id, owner)

    @router.get(
        "/subscriptions/{subscription_id:int}/deliveries", response_model=list[DeliveryModel],
        summary="One subscription's deliveries, newest first",
    )
    def deliveries(
        subscription_id: SubscriptionId, owner: Tenant,
        limit: Annotated[int, Query(ge=1, le=200, description="How many, newest first.")] = 50,
    ) -> list[Any]:
        with answers():
            owned(subscription_id, owner)
            return subscriptions.recent_deliveries(subscription_id, limit=limit)

    def action(
        path: str, name: str, summary: str, request_model: type[BaseModel], response_model: type[BaseModel],
        perform: Callable[[int, Any, str, str], Any],
    ) -> None:
        """A POST whose body is ``request_model``: ``perform(id, body, tenant, actor)`` once the row is the tenant's."""

        async def act(request: Request, owner: Tenant, by: Actor, subscription_id: SubscriptionId) -> Any:
            body = await read_json_body(request, request_model)

            def run() -> Any:
                owned(subscription_id, owner)
                return perform(subscription_id, body, owner, by)

            with answers():
                return await run_in_threadpool(run)

        router.add_api_route(
            f"/subscriptions/{{subscription_id:int}}/{path}", act, methods=["POST"], response_model=response_model,
            dependencies=[Depends(require_json)], summary=summary, name=f"outboxkit_tenant_subscription_{name}",
            openapi_extra=inline_schema(request_model),
        )

    def edit(number: int, body: TenantSubscriptionFields, owner: str, by: str) -> SubscriptionActionResult:
        fields = SubscriptionFields(**body.model_dump(), tenant=owner)
        return SubscriptionActionResult(subscription=subscriptions.edit(number, fields, actor=by))

    def rotate(number: int, body: RotateRequest, owner: str, by: str) -> RotateResult:
        found, secret = subscriptions.rotate(number, actor=by, secret=body.secret, keep_previous=body.keep_previous)
        return RotateResult(subscription=found, secret=secret)

    def delete(number: int, body: EmptyRequest, owner: str, by: str) -> SubscriptionActionResult:
        subscriptions.delete(number, actor=by)
        return SubscriptionActionResult(subscription=None)

    action("edit", "edit", "Change an endpoint, its event types or headers (its secrets stay)",
           TenantSubscriptionFields, SubscriptionActionResult, edit)
    action("disable", "disable", "Pause deliveries to a subscription (held until enabled)", SubscriptionDisable,
           SubscriptionActionResult, lambda number, body, owner, by: SubscriptionActionResult(
               subscription=subscriptions.disable(number, reason=body.reason, actor=by)))
    action("enable", "enable", "Resume deliveries (those held are sent now)", EmptyRequest, SubscriptionActionResult,
           lambda number, body, owner, by: SubscriptionActionResult(subscription=subscriptions.enable(number, actor=by)))
    action("delete", "delete", "Delete a subscription", EmptyRequest, SubscriptionActionResult, delete)
    action("rotate-secret", "rotate_secret", "Rotate the signing secret (the new one is shown once)", RotateRequest,
           RotateResult, rotate)
    action("test-event", "test_event", "Send a test event (outboxkit.test)", EmptyRequest, TestEventResult,
           lambda number, body, owner, by: TestEventResult(subscription_id=number,
                                                          event_id=subscriptions.send_test(number, actor=by)))

    async def resend(
        request: Request, owner: Tenant, by: Actor, subscription_id: SubscriptionId, event_id: EventId
    ) -> TestEventResult:
        await read_json_body(request, EmptyRequest)

        def run() -> TestEventResult:
            owned(subscription_id, owner)
            subscriptions.resend(subscription_id, event_id, actor=by)
            return TestEventResult(subscription_id=subscription_id, event_id=event_id)

        with answers():
            return await run_in_threadpool(run)

    router.add_api_route(
        "/subscriptions/{subscription_id:int}/deliveries/{event_id:int}/resend", resend, methods=["POST"],
        response_model=TestEventResult, dependencies=[Depends(require_json)], name="outboxkit_tenant_subscription_resend",
        summary="Send one event again to this subscription", openapi_extra=inline_schema(EmptyRequest),
    )
    return router

