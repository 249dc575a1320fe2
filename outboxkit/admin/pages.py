"""The admin's HTML pages: server-rendered, usable without JavaScript.

Every page is a GET that changes nothing.  Every change is a POST form that
carries the CSRF token (see ``outboxkit.admin.csrf``); a POST without a valid
token for the signed-in actor is answered 403 before the database is read or
written.  After a change the browser is redirected (303) to a page that shows
the result, so reloading never repeats an action; the result travels in a
signed flash cookie (see ``outboxkit.admin.flash``), never in the URL, so a
link cannot make a page claim a change that did not happen.

The cookies are scoped to the admin's mount path.  Query and form values are
parsed strictly: a number is ASCII digits (``"²".isdigit()`` is true in
Python, and ``int("²")`` raises).  The pages are left out of the OpenAPI
schema; the JSON API is the documented interface.
"""

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData

from outboxkit.admin.api import MAX_PAGE_SIZE, JobIdPath, OutboxName, RowIdPath
from outboxkit.admin.csrf import CSRF_FIELD, CsrfTokens
from outboxkit.admin.flash import FLASH_SECONDS, Flash, FlashNotices
from outboxkit.admin.rendering import STATIC_FILES, make_environment, static_file
from outboxkit.admin.routing import DATABASE_UNAVAILABLE_ERRORS, AdminRoute, BodyTooLarge, report_database_unavailable
from outboxkit.errors import InvalidValueError, UnknownJobError, UnknownOutboxError
from outboxkit.operations.controls import OutboxPaused
from outboxkit.operations.cursor import InvalidCursor
from outboxkit.operations.schemas import MAX_BULK_IDS, MAX_ROW_ID, STATUS_VALUES, FilterText
from outboxkit.operations.service import AdminService, InvalidSearch, RowsHeld, RowsNotFound
from outboxkit.row_filter import RowFilter

__all__ = ["pages_router"]

_filter_text = TypeAdapter(FilterText)


class PageInputError(ValueError):
    """A page's query or form field is malformed (answered 422)."""


def _ascii_number(value: str, *, low: int, high: int, what: str) -> int:
    if not (value.isascii() and value.isdigit()) or len(value) > len(str(high)) or not low <= int(value) <= high:
        raise PageInputError(f"{what} must be a whole number from {low} to {high}, got {value[:40]!r}")
    return int(value)


FILTER_FIELDS = (
    "error_contains",
    "status_code",
    "created_after",
    "created_before",
    "updated_after",
    "updated_before",
    "attempts_min",
    "attempts_max",
    "payload_column",
    "payload_contains",
)
PAGE_SIZES = (20, 50, 100, 200)


def _moment(value: str, what: str) -> datetime:
    """An ISO 8601 time from a form (``datetime-local`` sends no offset: it is read as UTC, as the pages show times)."""
    try:
        moment = datetime.fromisoformat(value) if value.isascii() and len(value) <= 40 else None
    except ValueError:
        moment = None
    if moment is None:
        raise PageInputError(f"bad filter: {what} must be a time like 2030-01-01T12:00 (UTC), got {value[:40]!r}")
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment


def _text(value: str | None, what: str) -> str | None:
    try:
        return _filter_text.validate_python(value or None)
    except ValidationError as exc:
        raise PageInputError(f"bad filter: {what}: {exc.errors()[0]['msg']}") from None


def _row_filter(values: Callable[[str], str | None]) -> RowFilter:
    """The filter from query or form fields (``values(name)``); each malformed field is a clear 422."""
    fields: dict[str, Any] = {}
    for name in FILTER_FIELDS:
        raw = values(name)
        value = raw.strip() if isinstance(raw, str) else ""
        if not value:
            continue
        if name == "status_code":
            fields[name] = _ascii_number(value, low=100, high=599, what="bad filter: the status code")
        elif name.startswith("attempts_"):
            fields[name] = _ascii_number(value, low=0, high=1_000_000, what=f"bad filter: {name.replace('_', ' ')}")
        elif name.endswith(("_after", "_before")):
            fields[name] = _moment(value, name.replace("_", " "))
        else:
            fields[name] = _text(raw, name.replace("_", " "))
    return RowFilter(**fields)


def _advanced(row_filter: RowFilter) -> bool:
    """Whether a filter beyond error text and status code is set (the page then shows those fields open)."""
    return any(value is not None for name, value in row_filter.as_dict().items() if name not in ("error_contains", "status_code"))


def _selected_ids(values: list[Any]) -> list[int]:
    if not values:
        raise PageInputError("bad selection: select at least one row")
    if len(values) > MAX_BULK_IDS:
        raise PageInputError(f"bad selection: at most {MAX_BULK_IDS} rows at once")
    return [
        _ascii_number(value if isinstance(value, str) else "", low=1, high=MAX_ROW_ID, what="bad selection: a row id")
        for value in values
    ]


def _form_text(form: FormData, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None


def pages_router(
    service: AdminService,
    *,
    actor: Callable[..., str],
    csrf: CsrfTokens,
    flashes: FlashNotices,
    page_size: int,
    route_class: type[AdminRoute] = AdminRoute,
) -> APIRouter:
    """The HTML routes over ``service``."""
    router = APIRouter(include_in_schema=False, route_class=route_class)
    environment = make_environment()
    Actor = Annotated[str, Depends(actor)]

    def url(request: Request, route: str, query: dict[str, Any] | None = None, **path_params: Any) -> str:
        path = request.url_for(f"outboxkit_admin_{route}", **path_params).path
        pairs = {key: value for key, value in (query or {}).items() if value not in (None, "")}
        return f"{path}?{urlencode(pairs)}" if pairs else path

    def mount_path(request: Request) -> str:
        """Where the application mounted the admin: the cookies' Path."""
        return url(request, "overview").rstrip("/") or "/"

    def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int) -> None:
        response.set_cookie(
            name,
            value,
            max_age=max_age,
            path=mount_path(request),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def render(request: Request, who: str, template: str, *, status_code: int = 200, **context: Any) -> HTMLResponse:
        mount = mount_path(request)
        csrf_cookie = csrf.cookie_name(mount)
        token = request.cookies.get(csrf_cookie)
        reissue = token is None or not csrf.is_fresh(token, actor=who, mount_path=mount)
        if reissue or token is None:
            token = csrf.issue(actor=who, mount_path=mount)
        flash_cookie = flashes.cookie_name(mount)
        flash_value = request.cookies.get(flash_cookie)
        flash = flashes.decode(flash_value, actor=who, mount_path=mount) if flash_value else None
        html = environment.get_template(template).render(
            url=lambda route, query=None, **params: url(request, route, query, **params),
            now=service.kit.clock.now(),
            csrf_field=CSRF_FIELD,
            csrf_token=token,
            outbox_names=service.outbox_names,
            notice=flash.message if flash else None,
            **context,
        )
        response = HTMLResponse(html, status_code=status_code)
        if reissue:
            set_cookie(response, request, csrf_cookie, token, csrf.lifetime_seconds)
        if flash_value is not None:  # shown (or worthless): either way, only once
            response.delete_cookie(
                flash_cookie, path=mount, httponly=True, samesite="strict", secure=request.url.scheme == "https"
            )
        return response

    def error_page(request: Request, who: str, status_code: int, message: str, heading: str = "Not done") -> HTMLResponse:
        return render(request, who, "error.html", status_code=status_code, message=message, heading=heading)

    def guarded(request: Request, who: str, build: Callable[[], Response]) -> Response:
        """Answer the service's refusals, and a database that is away, with an error page instead of a stack trace."""
        refusals: tuple[tuple[type[Exception], int], ...] = (
            (UnknownOutboxError, 404),
            (UnknownJobError, 404),
            (RowsNotFound, 404),
            (RowsHeld, 409),
            (OutboxPaused, 409),
            (InvalidCursor, 400),
            (PageInputError, 422),
            (InvalidValueError, 422),
            (InvalidSearch, 422),
        )
        try:
            return build()
        except tuple(kind for kind, _ in refusals) as exc:
            status_code = next(code for kind, code in refusals if isinstance(exc, kind))
            return error_page(request, who, status_code, str(exc))
        except DATABASE_UNAVAILABLE_ERRORS as exc:
            return error_page(request, who, 503, report_database_unavailable(exc), heading="Database unreachable")

    def redirect(request: Request, who: str, target: str, flash: Flash) -> RedirectResponse:
        response = RedirectResponse(target, status_code=303)
        mount = mount_path(request)
        set_cookie(
            response, request, flashes.cookie_name(mount), flashes.encode(flash, actor=who, mount_path=mount), FLASH_SECONDS
        )
        return response

    async def post_action(request: Request, who: str, act: Callable[[FormData], Response]) -> Response:
        """Read the form (capped), check the CSRF token; then act in a worker thread, refusals as error pages."""
        try:
            form = await request.form(max_fields=2 * MAX_BULK_IDS + 10)  # ids and page_ids
        except BodyTooLarge as exc:
            return error_page(request, who, 413, str(exc))
        mount = mount_path(request)
        cookie = request.cookies.get(csrf.cookie_name(mount))
        if not csrf.accepts(cookie=cookie, submitted=_form_text(form, CSRF_FIELD), actor=who, mount_path=mount):
            message = (
                "The form's security token is missing, invalid or expired; nothing was changed. Reload the page and try again."
            )
            return error_page(request, who, 403, message)
        return await run_in_threadpool(guarded, request, who, lambda: act(form))

    @router.get("/", name="outboxkit_admin_overview")
    def overview(request: Request, who: Actor, refresh: str | None = None) -> Response:
        def build() -> Response:
            seconds = _ascii_number(refresh, low=5, high=3600, what="refresh") if refresh else None
            return render(request, who, "overview.html", overview=service.overview(charts=True), refresh=seconds)

        return guarded(request, who, build)

    @router.get("/outboxes/{outbox}", name="outboxkit_admin_rows")
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
            size = _ascii_number(limit, low=1, high=MAX_PAGE_SIZE, what="the page size") if limit else page_size
            row_filter = _row_filter(request.query_params.get)
            page = service.rows(outbox, status=status, row_filter=row_filter, cursor=cursor, limit=size, with_counts=True)
            summary = service.outbox_overview(outbox)
            return render(
                request,
                who,
                "rows.html",
                page=page,
                summary=summary,
                filter_query=row_filter.as_dict(),
                page_query={"limit": limit} if limit else {},
                page_sizes=sorted({*PAGE_SIZES, page_size}),
                payload_columns=service.payload_columns(outbox),
                filter_open=_advanced(row_filter),
            )

        return guarded(request, who, build)

    @router.get("/search", name="outboxkit_admin_search")
    def search(request: Request, who: Actor, q: str = "", outbox: str | None = None) -> Response:
        def build() -> Response:
            if not q.strip():
                raise PageInputError("type a row id or an idempotency key to search for")
            found = service.find(q[:100], outbox_name=outbox or None)
            if len(found) == 1:
                return RedirectResponse(url(request, "row", outbox=found[0].outbox, row_id=found[0].row.id), status_code=303)
            return render(request, who, "search.html", query=q[:100], found=found, status_code=200 if found else 404)

        return guarded(request, who, build)

    @router.get("/outboxes/{outbox}/rows/{row_id}", name="outboxkit_admin_row")
    def row(request: Request, outbox: OutboxName, row_id: RowIdPath, who: Actor) -> Response:
        return guarded(request, who, lambda: render(request, who, "row.html", row=service.row(outbox, row_id)))

    def row_action(action: str) -> Callable[..., Any]:
        perform = service.reset if action == "reset" else service.retry_now

        async def act(request: Request, outbox: OutboxName, row_id: RowIdPath, who: Actor) -> Response:
            def build(form: FormData) -> Response:
                result = perform(outbox, [row_id], actor=who)
                flash = Flash(kind=action if result.changed else "unchanged", count=result.changed)  # type: ignore[arg-type]
                return redirect(request, who, url(request, "row", outbox=outbox, row_id=row_id), flash)

            return await post_action(request, who, build)

        return act

    router.add_api_route(
        "/outboxes/{outbox}/rows/{row_id}/reset", row_action("reset"), methods=["POST"], name="outboxkit_admin_reset_row"
    )
    router.add_api_route(
        "/outboxes/{outbox}/rows/{row_id}/retry-now", row_action("retry_now"), methods=["POST"], name="outboxkit_admin_retry_row"
    )

    def selected_action(action: str) -> Callable[..., Any]:
        perform, tab = (service.reset, "stuck") if action == "reset" else (service.retry_now, "pending")

        async def act(request: Request, outbox: OutboxName, who: Actor) -> Response:
            def build(form: FormData) -> Response:
                # "all on this page" sends every row id the page listed; otherwise the ticked ones.
                field = "page_ids" if _form_text(form, "scope") == "page" else "ids"
                result = perform(outbox, _selected_ids(form.getlist(field)), actor=who)
                target = url(request, "rows", {"status": tab}, outbox=outbox)
                return redirect(
                    request, who, target, Flash(kind="reset_many" if action == "reset" else "retry_many", count=result.changed)
                )

            return await post_action(request, who, build)

        return act

    router.add_api_route(
        "/outboxes/{outbox}/reset-selected", selected_action("reset"), methods=["POST"], name="outboxkit_admin_reset_selected"
    )
    router.add_api_route(
        "/outboxes/{outbox}/retry-selected", selected_action("retry_now"), methods=["POST"], name="outboxkit_admin_retry_selected"
    )

    def control_action(action: str) -> Callable[..., Any]:
        perform = {"pause": service.controls.pause, "resume": service.controls.resume, "drain_now": service.controls.drain_now}[
            action
        ]
        kinds = {"pause": "paused", "resume": "resumed", "drain_now": "drain_now"}

        async def act(request: Request, outbox: OutboxName, who: Actor) -> Response:
            def build(form: FormData) -> Response:
                result = perform(outbox, actor=who)
                back = _form_text(form, "back")
                target = url(request, "jobs") if back == "jobs" else url(request, "rows", outbox=outbox)
                flash = Flash(kind=kinds[action] if result.changed else "already", count=result.due_rows or 0)  # type: ignore[arg-type]
                return redirect(request, who, target, flash)

            return await post_action(request, who, build)

        return act

    for control in ("pause", "resume", "drain_now"):
        router.add_api_route(
            f"/outboxes/{{outbox}}/{control.replace('_', '-')}",
            control_action(control),
            methods=["POST"],
            name=f"outboxkit_admin_{control}",
        )

    @router.get("/outboxes/{outbox}/bulk-reset", name="outboxkit_admin_bulk_reset")
    def bulk_reset_confirm(request: Request, outbox: OutboxName, who: Actor) -> Response:
        def build() -> Response:
            row_filter = _row_filter(request.query_params.get)
            preview = service.reset_matching(outbox, row_filter, dry_run=True, actor=who)
            return render(request, who, "bulk_reset.html", preview=preview, filter_query=row_filter.as_dict())

        return guarded(request, who, build)

    @router.post("/outboxes/{outbox}/bulk-reset", name="outboxkit_admin_bulk_reset_apply")
    async def bulk_reset_apply(request: Request, outbox: OutboxName, who: Actor) -> Response:
        def build(form: FormData) -> Response:
            row_filter = _row_filter(lambda name: _form_text(form, name))
            result = service.reset_matching(outbox, row_filter, dry_run=False, actor=who)
            target = url(request, "rows", {"status": "stuck", **row_filter.as_dict()}, outbox=outbox)
            return redirect(request, who, target, Flash(kind="reset_many", count=result.changed))

        return await post_action(request, who, build)

    @router.get("/audit", name="outboxkit_admin_audit")
    def audit(request: Request, who: Actor, outbox: str | None = None, cursor: str | None = None) -> Response:
        def build() -> Response:
            page = service.audit(outbox_name=outbox or None, cursor=cursor, limit=page_size)
            return render(request, who, "audit.html", page=page, outbox=outbox or None)

        return guarded(request, who, build)

    @router.get("/jobs", name="outboxkit_admin_jobs")
    def jobs(request: Request, who: Actor) -> Response:
        return guarded(request, who, lambda: render(request, who, "jobs.html", view=service.jobs()))

    @router.get("/jobs/{job_id}", name="outboxkit_admin_job")
    def job(request: Request, job_id: JobIdPath, who: Actor) -> Response:
        def build() -> Response:
            history = service.job_runs(job_id, limit=page_size)
            entry = next((job for job in service.jobs().jobs if job.id == job_id), None)
            return render(request, who, "job.html", history=history, job=entry, page_size=page_size)

        return guarded(request, who, build)

    @router.get("/static/{name}", name="outboxkit_admin_static")
    def static(name: Annotated[str, Path(max_length=50)]) -> Response:
        if name not in STATIC_FILES:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response(static_file(name), media_type=STATIC_FILES[name], headers={"Cache-Control": "max-age=3600"})

    return router
