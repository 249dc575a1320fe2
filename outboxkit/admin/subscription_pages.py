"""The subscription pages: the list, one subscription, the create and edit form, and the actions.

::

    GET  /subscriptions?tenant=                  every subscription (of a tenant), by id
    GET  /subscriptions/_new                     the create form, its secret field filled with a new secret
    POST /subscriptions/_new                     create; a refusal shows the form again, the error next to its input
    GET  /subscriptions/{id}                     one: facts, deliveries by status, changes, actions
    GET  /subscriptions/{id}/edit                the edit form (the secrets are not on it: rotate them)
    POST /subscriptions/{id}/edit                edit; a refusal as for create
    POST /subscriptions/{id}/disable             form: reason
    POST /subscriptions/{id}/enable|test-event
    GET  /subscriptions/{id}/rotate              the rotation form, filled with a new secret (changes nothing)
    POST /subscriptions/{id}/rotate              rotate
    GET  /subscriptions/{id}/delete              asks first (changes nothing)
    POST /subscriptions/{id}/delete              delete

The form's rate limit (requests per second) and max in flight are the
subscription's own limits; blank is the deliveries outbox's own, and a value
that is not a number, or out of range, comes back next to its input.

Each POST follows the admin's discipline (``outboxkit.admin.page_frame``):
the CSRF token first, then the action in a worker thread, audited with the
actor, and a 303 to a page whose flash notice says what happened.  A secret
is never shown back: the forms that need one are filled with a new one when
they are opened, for the operator to hand to the receiver before saving.
"""


# No ``from __future__ import annotations``: FastAPI reads each route's ``Actor`` annotation at runtime.
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.datastructures import FormData

from outboxkit.admin.confirm_pages import render_confirm
from outboxkit.admin.csrf import CsrfTokens
from outboxkit.admin.flash import Flash, FlashKind, FlashNotices
from outboxkit.admin.page_frame import PageRoutes
from outboxkit.admin.page_inputs import form_text
from outboxkit.admin.route_guard import AdminRoute
from outboxkit.admin.subscription_api import subscription_detail
from outboxkit.admin.subscription_replay_pages import add_subscription_replay
from outboxkit.errors import InvalidSubscriptionError, InvalidValueError, PageInputError
from outboxkit.operations.destination_limits import limit_from_text
from outboxkit.operations.service import OperationsService
from outboxkit.operations.subscription_admin import SubscriptionAdmin, generated_secret
from outboxkit.operations.subscription_schemas import SubscriptionCreate, SubscriptionFields

__all__ = ["SubscriptionForm", "subscription_pages_router"]

SubscriptionId = Annotated[int, Path(ge=1, le=2**63 - 1)]
_FIELDS = ("url", "event_types", "tenant", "headers", "description", "rate_limit", "max_in_flight", "secret")
# The limits' inputs: what a refusal calls each, and whether it takes a whole number.
_LIMITS = {"rate_limit": ("rate limit", False), "max_in_flight": ("max in flight", True)}


@dataclass(frozen=True)
class SubscriptionForm:
    """The create and edit form as typed (``values``) and what is wrong with it (``errors``, by input)."""

    values: dict[str, str]
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def posted(cls, form: FormData) -> "SubscriptionForm":
        return cls(values={name: (form_text(form, name) or "").strip() for name in _FIELDS})

    @classmethod
    def of(cls, found: Any) -> "SubscriptionForm":
        headers = "\n".join(f"{name}: {value}" for name, value in found.headers.items())
        return cls(values={"url": found.url, "event_types": "\n".join(found.event_types), "tenant": found.tenant or "",
                           "headers": headers, "description": found.description,
                           "rate_limit": "" if found.rate_limit is None else f"{found.rate_limit:g}",
                           "max_in_flight": "" if found.max_in_flight is None else str(found.max_in_flight)})

    def refuse(self, input_name: str, message: str) -> "SubscriptionForm":
        shown = input_name if input_name in _FIELDS else ("secret" if input_name == "secrets" else "url")
        return SubscriptionForm(values=self.values, errors={**self.errors, shown: message})

    def fields(self, *, with_secret: bool) -> SubscriptionCreate | SubscriptionFields:
        """The request the form stands for; ``InvalidSubscriptionError`` names the input at fault."""
        values = self.values
        headers: dict[str, str] = {}
        for number, line in enumerate(values.get("headers", "").splitlines(), start=1):
            if not line.strip():
                continue
            name, colon, value = line.partition(":")
            if not colon or not name.strip():
                raise InvalidSubscriptionError("headers", f"line {number}: write each header as 'Name: value'")
            headers[name.strip()] = value.strip()
        filters = [entry.strip() for entry in values.get("event_types", "").replace(",", "\n").splitlines() if entry.strip()]
        data: dict[str, Any] = {
            "url": values.get("url", ""), "event_types": filters, "tenant": values.get("tenant") or None,
            "headers": headers, "description": values.get("description", ""),
        }
        for name, (what, whole) in _LIMITS.items():  # blank: the deliveries outbox's own; the range is the store's
            try:
                data[name] = limit_from_text(values.get(name), what, whole=whole)
            except InvalidValueError as exc:
                raise InvalidSubscriptionError(name, str(exc)) from None
        if with_secret:
            data["secrets"] = [values["secret"]] if values.get("secret") else None
        try:
            return (SubscriptionCreate if with_secret else SubscriptionFields).model_validate(data)
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = str(problem["loc"][0]) if problem["loc"] else "url"
            raise InvalidSubscriptionError(where, problem["msg"]) from None


def subscription_pages_router(
    service: OperationsService,
    subscriptions: SubscriptionAdmin,
    *,
    actor: Callable[..., str],
    csrf: CsrfTokens,
    flashes: FlashNotices,
    page_size: int,
    route_class: type[AdminRoute] = AdminRoute,
) -> APIRouter:
    """The subscription pages over ``subscriptions`` (the same page frame as the other pages)."""
    routes = PageRoutes.create(service, actor=actor, csrf=csrf, flashes=flashes, page_size=page_size, route_class=route_class)
    add_subscription_list(routes, subscriptions)
    add_subscription_form(routes, subscriptions)  # before /subscriptions/{id}: "_new" is no id
    add_subscription_detail(routes, subscriptions)
    add_subscription_action(routes, "enable", lambda number, form, who: subscriptions.enable(number, actor=who),
                            done="subscription_enabled")
    add_subscription_action(routes, "disable", lambda number, form, who: subscriptions.disable(
        number, reason=form_text(form, "reason") or "", actor=who), done="subscription_disabled")
    add_subscription_action(routes, "test-event", lambda number, form, who: subscriptions.send_test(number, actor=who),
                            done="subscription_test_sent")
    add_subscription_rotate(routes, subscriptions)
    add_subscription_delete(routes, subscriptions)
    add_subscription_replay(routes, subscriptions)
    return routes.router


def add_subscription_list(routes: PageRoutes, subscriptions: SubscriptionAdmin) -> None:
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/subscriptions", name="outboxkit_admin_subscriptions")
    def subscription_list(request: Request, who: Actor, tenant: str | None = None) -> Response:
        def build() -> Response:
            if tenant is not None and len(tenant) > 200:
                raise PageInputError("tenant must be at most 200 characters")
            found = subscriptions.subscriptions(tenant=tenant or None)
            return frame.render(request, who, "subscriptions.html", subscriptions=found, tenant=tenant or "")

        return frame.guarded(request, who, build)


def add_subscription_detail(routes: PageRoutes, subscriptions: SubscriptionAdmin) -> None:
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/subscriptions/{subscription_id}", name="outboxkit_admin_subscription")
    def subscription(request: Request, subscription_id: SubscriptionId, who: Actor) -> Response:
        def build() -> Response:
            detail = subscription_detail(subscriptions, subscription_id)
            return frame.render(request, who, "subscription.html", detail=detail, found=detail.subscription)

        return frame.guarded(request, who, build)


def add_subscription_form(routes: PageRoutes, subscriptions: SubscriptionAdmin) -> None:
    """Create and edit: one form; a refused one comes back (422) with the error next to its input."""
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    def render_form(
        request: Request, who: str, form: SubscriptionForm, *, number: int | None, status_code: int = 200
    ) -> Response:
        action = frame.url(request, "subscription_edit_apply", subscription_id=number) if number else frame.url(
            request, "subscription_create"
        )
        return frame.render(request, who, "subscription_form.html", form=form, number=number, action=action,
                            status_code=status_code)

    def submit(request: Request, who: str, form_data: FormData, number: int | None) -> Response:
        form = SubscriptionForm.posted(form_data)
        try:
            if number is None:
                created, _ = subscriptions.create_from(form.fields(with_secret=True), actor=who)  # type: ignore[arg-type]
                number = created.id
                kind: FlashKind = "subscription_created"
            else:
                subscriptions.edit(number, form.fields(with_secret=False), actor=who)
                kind = "subscription_edited"
        except InvalidSubscriptionError as exc:
            return render_form(request, who, form.refuse(exc.field, str(exc)), number=number, status_code=422)
        return frame.redirect(request, who, frame.url(request, "subscription", subscription_id=number), Flash(kind=kind))

    @routes.router.get("/subscriptions/_new", name="outboxkit_admin_subscription_new")
    def new(request: Request, who: Actor) -> Response:
        blank = SubscriptionForm(values={"secret": generated_secret()})
        return frame.guarded(request, who, lambda: render_form(request, who, blank, number=None))

    @routes.router.post("/subscriptions/_new", name="outboxkit_admin_subscription_create")
    async def create(request: Request, who: Actor) -> Response:
        return await frame.post_action(request, who, lambda form: submit(request, who, form, None))

    @routes.router.get("/subscriptions/{subscription_id}/edit", name="outboxkit_admin_subscription_edit")
    def edit(request: Request, subscription_id: SubscriptionId, who: Actor) -> Response:
        return frame.guarded(request, who, lambda: render_form(
            request, who, SubscriptionForm.of(subscriptions.get(subscription_id)), number=subscription_id
        ))

    @routes.router.post("/subscriptions/{subscription_id}/edit", name="outboxkit_admin_subscription_edit_apply")
    async def edit_apply(request: Request, subscription_id: SubscriptionId, who: Actor) -> Response:
        return await frame.post_action(request, who, lambda form: submit(request, who, form, subscription_id))


def add_subscription_action(
    routes: PageRoutes, path: str, perform: Callable[[int, FormData, str], object], *, done: FlashKind
) -> None:
    """A button on a subscription's page: ``perform`` it, then back to its page with the notice."""
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    async def act(request: Request, subscription_id: SubscriptionId, who: Actor) -> Response:
        def build(form: FormData) -> Response:
            try:
                perform(subscription_id, form, who)
            except InvalidSubscriptionError as exc:  # a reason left empty, a secret in the wrong form, a disabled one
                raise PageInputError(str(exc)) from None
            return frame.redirect(request, who, frame.url(request, "subscription", subscription_id=subscription_id),
                                  Flash(kind=done))

        return await frame.post_action(request, who, build)

    routes.router.add_api_route(
        f"/subscriptions/{{subscription_id}}/{path}", act, methods=["POST"],
        name=f"outboxkit_admin_subscription_{path.replace('-', '_')}",
    )


def add_subscription_rotate(routes: PageRoutes, subscriptions: SubscriptionAdmin) -> None:
    """Rotate: a form filled with a new secret (copy it to the receiver first), then the rotation."""
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/subscriptions/{subscription_id}/rotate", name="outboxkit_admin_subscription_rotate_form")
    def rotate_form(request: Request, subscription_id: SubscriptionId, who: Actor) -> Response:
        def build() -> Response:
            found = subscriptions.get(subscription_id)
            return frame.render(request, who, "subscription_rotate.html", found=found, secret=generated_secret())

        return frame.guarded(request, who, build)

    add_subscription_action(routes, "rotate", lambda number, form, who: subscriptions.rotate(
        number, actor=who, secret=form_text(form, "secret") or "", keep_previous=form_text(form, "keep_previous") == "on",
    ), done="subscription_rotated")


def add_subscription_delete(routes: PageRoutes, subscriptions: SubscriptionAdmin) -> None:
    """Delete asks first: what a delete keeps, with the form that deletes."""
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/subscriptions/{subscription_id}/delete", name="outboxkit_admin_subscription_delete_confirm")
    def delete_confirm(request: Request, subscription_id: SubscriptionId, who: Actor) -> Response:
        def build() -> Response:
            found = subscriptions.get(subscription_id)
            pending = subscriptions.deliveries(subscription_id)["pending"]
            return render_confirm(
                frame, request, who,
                heading=f"Delete subscription {found.id} ({found.url})?",
                explanation=[
                    "It receives no new event. Its deliveries not sent yet are parked stuck with the reason, never sent; "
                    "they, its events and its audit stay.",
                    f"Now: {pending:,} delivery(ies) pending.",
                ],
                action=frame.url(request, "subscription_delete", subscription_id=subscription_id),
                fields=[], button="Delete subscription",
                cancel=frame.url(request, "subscription", subscription_id=subscription_id),
            )

        return frame.guarded(request, who, build)

    @routes.router.post("/subscriptions/{subscription_id}/delete", name="outboxkit_admin_subscription_delete")
    async def delete(request: Request, subscription_id: SubscriptionId, who: Actor) -> Response:
        def build(form: FormData) -> Response:
            subscriptions.delete(subscription_id, actor=who)
            return frame.redirect(request, who, frame.url(request, "subscriptions"), Flash(kind="subscription_deleted"))

        return await frame.post_action(request, who, build)
