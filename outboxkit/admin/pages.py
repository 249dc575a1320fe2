"""The admin's HTML pages: server-rendered, usable without JavaScript.

Every page is a GET that changes nothing.  Every change is a POST form that
carries the CSRF token (see ``outboxkit.admin.csrf``); a POST without a valid
token for the signed-in actor is answered 403 before the database is read or
written.  After a change the browser is redirected (303) to a page that shows
the result, so reloading never repeats an action; the result travels in a
signed flash cookie (see ``outboxkit.admin.flash``), never in the URL, so a
link cannot make a page claim a change that did not happen.

The cookies are scoped to the admin's mount path.  Query and form values are
parsed strictly (``outboxkit.admin.page_inputs``); rendering, cookies and the
POST discipline are ``outboxkit.admin.page_frame``'s.  Each page and each
action is added by one function below; an action is given the service
method it performs and the notice it leaves.  The pages are left out of the
OpenAPI schema; the JSON API is the documented interface.
"""


# No ``from __future__ import annotations``: FastAPI reads each route's ``Actor`` annotation at runtime.
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import RedirectResponse, Response
from starlette.datastructures import FormData

from outboxkit.admin.api import MAX_PAGE_SIZE, JobIdPath, OutboxName, RowIdPath
from outboxkit.admin.confirm_pages import add_drain_now_confirm, add_pause_confirm, add_reset_page_confirm
from outboxkit.admin.csrf import CsrfTokens
from outboxkit.admin.destination_pages import add_destination_pages
from outboxkit.admin.flash import Flash, FlashKind, FlashNotices
from outboxkit.admin.inbox_pages import add_inbox_pages
from outboxkit.admin.page_frame import PageRoutes
from outboxkit.admin.page_inputs import (
    PAGE_SIZES,
    ascii_number,
    chart_window,
    form_text,
    is_advanced,
    row_filter_from,
    selected_ids,
)
from outboxkit.admin.rendering import STATIC_FILES, static_file
from outboxkit.admin.route_guard import AdminRoute
from outboxkit.errors import PageInputError
from outboxkit.operations.charts import WINDOWS
from outboxkit.operations.replay import DEFAULT_REPLAY_BATCH, MAX_REPLAY_BATCH
from outboxkit.operations.schemas import STATUS_VALUES, ActionResult, ControlResult
from outboxkit.operations.service import OperationsService

__all__ = ["pages_router"]

BUCKET_WORDS = {"1h": "minute", "24h": "15 minutes", "7d": "2 hours"}  # what one bar of each chart window stands for
RowAction = Callable[..., ActionResult]  # OperationsService.reset or .retry_now: (outbox, ids, *, actor)
Control = Callable[..., ControlResult]  # OutboxControls.pause, .resume or .drain_now: (outbox, *, actor)


def pages_router(
    service: OperationsService,
    *,
    actor: Callable[..., str],
    csrf: CsrfTokens,
    flashes: FlashNotices,
    page_size: int,
    route_class: type[AdminRoute] = AdminRoute,
) -> APIRouter:
    """The HTML routes over ``service``."""
    routes = PageRoutes.create(
        service, actor=actor, csrf=csrf, flashes=flashes, page_size=page_size, route_class=route_class
    )
    add_overview(routes)
    add_rows(routes)
    add_search(routes)
    add_row(routes)
    add_row_action(routes, "/outboxes/{outbox}/rows/{row_id}/reset", "reset_row", service.reset, done="reset")
    add_row_action(routes, "/outboxes/{outbox}/rows/{row_id}/retry-now", "retry_row", service.retry_now, done="retry_now")
    add_row_action(routes, "/outboxes/{outbox}/rows/{row_id}/skip", "skip_row", service.skip, done="skipped")
    add_row_action(routes, "/outboxes/{outbox}/rows/{row_id}/discard", "discard_row", service.discard, done="discarded")
    add_blocked_keys(routes)
    add_selected_action(
        routes, "/outboxes/{outbox}/reset-selected", "reset_selected", service.reset, tab="stuck", done="reset_many"
    )
    add_selected_action(
        routes, "/outboxes/{outbox}/discard-selected", "discard_selected", service.discard, tab="stuck", done="discard_many"
    )
    add_selected_action(
        routes, "/outboxes/{outbox}/retry-selected", "retry_selected", service.retry_now, tab="pending", done="retry_many"
    )
    add_control_action(routes, "/outboxes/{outbox}/pause", "pause", service.controls.pause, done="paused")
    add_control_action(routes, "/outboxes/{outbox}/resume", "resume", service.controls.resume, done="resumed")
    add_control_action(routes, "/outboxes/{outbox}/drain-now", "drain_now", service.controls.drain_now, done="drain_now")
    add_control_action(
        routes,
        "/outboxes/{outbox}/resume-and-drain-now",
        "resume_and_drain_now",
        service.controls.resume_and_drain_now,
        done="resumed_drain_now",
    )
    add_pause_confirm(routes)
    add_drain_now_confirm(routes)
    add_reset_page_confirm(routes)
    add_bulk_reset(routes)
    add_bulk_reset(routes, discard=True)
    add_replay(routes)
    add_audit(routes)
    add_jobs(routes)
    add_job(routes)
    add_destination_pages(routes)
    add_inbox_pages(routes)
    add_static(routes)
    return routes.router


def add_overview(routes: PageRoutes) -> None:
    frame, service = routes.frame, routes.service
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/", name="outboxkit_admin_overview")
    def overview(request: Request, who: Actor, refresh: str | None = None, window: str | None = None) -> Response:
        if service.kit.is_receive_only:  # no outboxes to show: a receiving service's overview is its inbox
            return RedirectResponse(request.url_for("outboxkit_admin_inbox"), status_code=303)

        def build() -> Response:
            seconds = ascii_number(refresh, low=5, high=3600, what="refresh") if refresh else None
            key = chart_window(window)
            return frame.render(
                request,
                who,
                "overview.html",
                overview=service.overview(charts=True, window=key),
                refresh=seconds,
                windows=WINDOWS,
                window=WINDOWS[key],
                window_key=key,
                window_query=window or None,
                bucket_words=BUCKET_WORDS[key],
            )

        return frame.guarded(request, who, build)


def add_rows(routes: PageRoutes) -> None:
    frame, service, page_size = routes.frame, routes.service, routes.page_size
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/outboxes/{outbox}", name="outboxkit_admin_rows")
    def rows(
        request: Request,
        outbox: OutboxName,
        who: Actor,
        status: str = "stuck",
        cursor: str | None = None,
        limit: str | None = None,
    ) -> Response:
        def build() -> Response:
            if status not in STATUS_VALUES:
                raise PageInputError(f"status must be one of {', '.join(STATUS_VALUES)}")
            size = ascii_number(limit, low=1, high=MAX_PAGE_SIZE, what="the page size") if limit else page_size
            row_filter = row_filter_from(request.query_params.get)
            page = service.rows(outbox, status=status, row_filter=row_filter, cursor=cursor, limit=size, with_counts=True)
            summary = service.outbox_overview(outbox)
            return frame.render(
                request,
                who,
                "rows.html",
                page=page,
                summary=summary,
                filter_query=row_filter.as_dict(),
                page_query={"limit": limit} if limit else {},
                page_sizes=sorted({*PAGE_SIZES, page_size}),
                payload_columns=service.payload_columns(outbox),
                filter_open=is_advanced(row_filter),
                ordering_key=service.ordered_keys.ordering_key(outbox),
            )

        return frame.guarded(request, who, build)


def add_search(routes: PageRoutes) -> None:
    frame, service = routes.frame, routes.service
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/search", name="outboxkit_admin_search")
    def search(request: Request, who: Actor, q: str = "", outbox: str | None = None) -> Response:
        def build() -> Response:
            if not q.strip():
                raise PageInputError("type a row id or an idempotency key to search for")
            found = service.find(q[:100], outbox_name=outbox or None)
            if len(found) == 1:
                target = frame.url(request, "row", outbox=found[0].outbox, row_id=found[0].row.id)
                return RedirectResponse(target, status_code=303)
            return frame.render(request, who, "search.html", query=q[:100], found=found, status_code=200 if found else 404)

        return frame.guarded(request, who, build)


def add_row(routes: PageRoutes) -> None:
    frame, service = routes.frame, routes.service
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/outboxes/{outbox}/rows/{row_id}", name="outboxkit_admin_row")
    def row(request: Request, outbox: OutboxName, row_id: RowIdPath, who: Actor) -> Response:
        return frame.guarded(request, who, lambda: frame.render(request, who, "row.html", row=service.row(outbox, row_id)))


def add_blocked_keys(routes: PageRoutes) -> None:
    """An ordered outbox's stuck heads, what each blocks, and the buttons to retry or skip each."""
    frame, service = routes.frame, routes.service
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/outboxes/{outbox}/blocked-keys", name="outboxkit_admin_blocked_keys")
    def blocked_keys(request: Request, outbox: OutboxName, who: Actor) -> Response:
        return frame.guarded(
            request, who,
            lambda: frame.render(request, who, "blocked_keys.html", blocked=service.ordered_keys.blocked_keys(outbox)),
        )


def add_row_action(routes: PageRoutes, path: str, name: str, perform: RowAction, *, done: FlashKind) -> None:
    """A button on one row's page: ``perform`` on that row, then back to it."""
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    async def act(request: Request, outbox: OutboxName, row_id: RowIdPath, who: Actor) -> Response:
        def build(form: FormData) -> Response:
            result = perform(outbox, [row_id], actor=who)
            flash = Flash(kind=done, count=result.changed) if result.changed else Flash(kind="unchanged")
            return frame.redirect(request, who, frame.url(request, "row", outbox=outbox, row_id=row_id), flash)

        return await frame.post_action(request, who, build)

    routes.router.add_api_route(path, act, methods=["POST"], name=f"outboxkit_admin_{name}")


def add_selected_action(routes: PageRoutes, path: str, name: str, perform: RowAction, *, tab: str, done: FlashKind) -> None:
    """A button under a list of rows: ``perform`` on the ticked rows (or all on the page), then back to ``tab``."""
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    async def act(request: Request, outbox: OutboxName, who: Actor) -> Response:
        def build(form: FormData) -> Response:
            # "all on this page" sends every row id the page listed; otherwise the ticked ones.
            field = "page_ids" if form_text(form, "scope") == "page" else "ids"
            result = perform(outbox, selected_ids(form.getlist(field)), actor=who)
            target = frame.url(request, "rows", {"status": tab}, outbox=outbox)
            return frame.redirect(request, who, target, Flash(kind=done, count=result.changed))

        return await frame.post_action(request, who, build)

    routes.router.add_api_route(path, act, methods=["POST"], name=f"outboxkit_admin_{name}")


def add_control_action(routes: PageRoutes, path: str, name: str, perform: Control, *, done: FlashKind) -> None:
    """A control of one outbox's drains (pause, resume, drain now), from its rows page, which it returns to."""
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    async def act(request: Request, outbox: OutboxName, who: Actor) -> Response:
        def build(form: FormData) -> Response:
            result = perform(outbox, actor=who)
            flash = Flash(kind=done if result.changed else "already", count=result.due_rows or 0)
            return frame.redirect(request, who, frame.url(request, "rows", outbox=outbox), flash)

        return await frame.post_action(request, who, build)

    routes.router.add_api_route(path, act, methods=["POST"], name=f"outboxkit_admin_{name}")


def add_bulk_reset(routes: PageRoutes, *, discard: bool = False) -> None:
    """Reset (``discard``: discard) every stuck row matching a filter: a confirmation page with a preview, then the
    action."""
    frame, service = routes.frame, routes.service
    Actor = Annotated[str, Depends(routes.actor)]
    name = "bulk_discard" if discard else "bulk_reset"
    path = f"/outboxes/{{outbox}}/{name.replace('_', '-')}"

    def bulk_confirm(request: Request, outbox: OutboxName, who: Actor) -> Response:
        def build() -> Response:
            row_filter = row_filter_from(request.query_params.get)
            preview = service.reset_matching(outbox, row_filter, dry_run=True, actor=who, discard=discard)
            return frame.render(
                request, who, "bulk_reset.html", preview=preview, filter_query=row_filter.as_dict(), discard=discard
            )

        return frame.guarded(request, who, build)

    async def bulk_apply(request: Request, outbox: OutboxName, who: Actor) -> Response:
        def build(form: FormData) -> Response:
            row_filter = row_filter_from(lambda name: form_text(form, name))
            result = service.reset_matching(outbox, row_filter, dry_run=False, actor=who, discard=discard)
            target = frame.url(request, "rows", {"status": "stuck", **row_filter.as_dict()}, outbox=outbox)
            kind: FlashKind = "reset_many" if result.complete else "reset_partial"
            if discard:
                kind = "discard_many" if result.complete else "discard_partial"
            return frame.redirect(request, who, target, Flash(kind=kind, count=result.changed))

        return await frame.post_action(request, who, build)

    routes.router.add_api_route(path, bulk_confirm, methods=["GET"], name=f"outboxkit_admin_{name}")
    routes.router.add_api_route(path, bulk_apply, methods=["POST"], name=f"outboxkit_admin_{name}_apply")


def add_replay(routes: PageRoutes) -> None:
    """Send delivered rows matching a filter again: a confirmation page with the dry-run count, then the replay."""
    frame, service = routes.frame, routes.service
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/outboxes/{outbox}/replay", name="outboxkit_admin_replay")
    def replay_confirm(request: Request, outbox: OutboxName, who: Actor) -> Response:
        def build() -> Response:
            row_filter = row_filter_from(request.query_params.get)
            preview = service.replays.replay(outbox, row_filter, actor=who, dry_run=True)
            return frame.render(
                request, who, "replay.html", preview=preview, filter_query=row_filter.as_dict(), max_batch=MAX_REPLAY_BATCH
            )

        return frame.guarded(request, who, build)

    @routes.router.post("/outboxes/{outbox}/replay", name="outboxkit_admin_replay_apply")
    async def replay_apply(request: Request, outbox: OutboxName, who: Actor) -> Response:
        def build(form: FormData) -> Response:
            row_filter = row_filter_from(lambda name: form_text(form, name))
            size = form_text(form, "batch_size") or str(DEFAULT_REPLAY_BATCH)
            batch_size = ascii_number(size, low=1, high=MAX_REPLAY_BATCH, what="the batch size")
            result = service.replays.replay(outbox, row_filter, actor=who, dry_run=False, batch_size=batch_size)
            target = frame.url(request, "rows", {"status": "pending"}, outbox=outbox)
            return frame.redirect(request, who, target, Flash(kind="replayed", count=result.replayed))

        return await frame.post_action(request, who, build)


def add_audit(routes: PageRoutes) -> None:
    frame, service, page_size = routes.frame, routes.service, routes.page_size
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/audit", name="outboxkit_admin_audit")
    def audit(request: Request, who: Actor, outbox: str | None = None, cursor: str | None = None) -> Response:
        def build() -> Response:
            page = service.audit(outbox_name=outbox or None, cursor=cursor, limit=page_size)
            return frame.render(request, who, "audit.html", page=page, outbox=outbox or None)

        return frame.guarded(request, who, build)


def add_jobs(routes: PageRoutes) -> None:
    """The old Jobs page: its elected jobs are on the Schedules page now (one scheduling concept), so its URL
    answers 303 there and bookmarks keep working."""
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/jobs", name="outboxkit_admin_jobs")
    def jobs(request: Request, who: Actor) -> Response:
        return RedirectResponse(frame.url(request, "schedules") + "#internal-jobs", status_code=303)


def add_job(routes: PageRoutes) -> None:
    """An old job page: 303 to the same job's run history under the Schedules page."""
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/jobs/{job_id:path}", name="outboxkit_admin_job")
    def job(request: Request, job_id: JobIdPath, who: Actor) -> Response:
        return RedirectResponse(frame.url(request, "internal_job", job_id=job_id), status_code=303)


def add_static(routes: PageRoutes) -> None:
    """The stylesheet, script and icon: no actor needed."""

    @routes.router.get("/static/{name}", name="outboxkit_admin_static")
    def static(name: Annotated[str, Path(max_length=50)]) -> Response:
        if name not in STATIC_FILES:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response(static_file(name), media_type=STATIC_FILES[name], headers={"Cache-Control": "max-age=3600"})
