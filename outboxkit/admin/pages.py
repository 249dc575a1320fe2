"""The admin's HTML pages: server-rendered, usable without JavaScript.

Every page is a GET that changes nothing.  Every change is a POST form that
carries the CSRF token (see ``outboxkit.admin.csrf``); a POST without a valid
token is answered 403 before anything is read or written.  After a change the
browser is redirected (303) to a page that shows the result, so reloading
never repeats an action.  The pages are left out of the OpenAPI schema; the
JSON API is the documented interface.
"""


from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData

from outboxkit.admin.api import AdminRoute, OutboxName, RowIdPath
from outboxkit.admin.csrf import CSRF_COOKIE, CSRF_FIELD, CsrfTokens
from outboxkit.admin.cursor import InvalidCursor
from outboxkit.admin.rendering import STATIC_FILES, make_environment, static_file
from outboxkit.admin.schemas import STATUS_VALUES, FilterText, IdsRequest, StatusCode
from outboxkit.admin.service import AdminService, RowsHeld, RowsNotFound
from outboxkit.errors import UnknownOutboxError
from outboxkit.queries import RowFilter

__all__ = ["pages_router"]

_filter_text = TypeAdapter(FilterText)
_status_code = TypeAdapter(StatusCode)
_ids = TypeAdapter(IdsRequest)
NOTICES = {
    "reset": "Reset: the row is pending and due now; the next drain sends it.",
    "retry_now": "The row is due now; the next drain sends it.",
    "unchanged": "Nothing to do: the row was not in a state this action applies to.",
}


class PageInputError(ValueError):
    """A page's query or form field is malformed (answered 422)."""


def _row_filter(error_contains: str | None, status_code: str | None) -> RowFilter:
    try:
        text = _filter_text.validate_python(error_contains or None)
        code = _status_code.validate_python(status_code.strip() if status_code and status_code.strip() else None)
    except ValidationError as exc:
        raise PageInputError(f"bad filter: {exc.errors()[0]['msg']}") from None
    return RowFilter(error_contains=text, status_code=code)


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() and len(value) < 19 else None


def pages_router(service: AdminService, *, actor: Callable[..., str], csrf: CsrfTokens, page_size: int) -> APIRouter:
    """The HTML routes over ``service``."""
    router = APIRouter(include_in_schema=False, route_class=AdminRoute)
    environment = make_environment()
    Actor = Annotated[str, Depends(actor)]

    def url(request: Request, route: str, query: dict[str, Any] | None = None, **path_params: Any) -> str:
        path = request.url_for(f"outboxkit_admin_{route}", **path_params).path
        pairs = {key: value for key, value in (query or {}).items() if value not in (None, "")}
        return f"{path}?{urlencode(pairs)}" if pairs else path

    def render(request: Request, template: str, *, status_code: int = 200, **context: Any) -> HTMLResponse:
        token = request.cookies.get(CSRF_COOKIE)
        fresh = not csrf.is_valid(token)
        if fresh:
            token = csrf.issue()
        html = environment.get_template(template).render(
            url=lambda route, query=None, **params: url(request, route, query, **params),
            now=service.kit.clock.now(),
            csrf_field=CSRF_FIELD,
            csrf_token=token,
            outbox_names=service.outbox_names,
            **context,
        )
        response = HTMLResponse(html, status_code=status_code)
        if fresh:
            response.set_cookie(
                CSRF_COOKIE, token, httponly=True, samesite="strict", secure=request.url.scheme == "https", path="/"
            )
        return response

    def guarded(request: Request, build: Callable[[], Response]) -> Response:
        """Answer the service's refusals with an error page instead of a stack trace."""
        refusals: tuple[tuple[type[Exception], int], ...] = (
            (UnknownOutboxError, 404),
            (RowsNotFound, 404),
            (RowsHeld, 409),
            (InvalidCursor, 400),
            (PageInputError, 422),
        )
        try:
            return build()
        except tuple(kind for kind, _ in refusals) as exc:
            status_code = next(code for kind, code in refusals if isinstance(exc, kind))
            return render(request, "error.html", status_code=status_code, message=str(exc))

    async def checked_form(request: Request) -> FormData | None:
        form = await request.form(max_fields=1000)
        submitted = form.get(CSRF_FIELD)
        ok = csrf.accepts(cookie=request.cookies.get(CSRF_COOKIE), submitted=submitted if isinstance(submitted, str) else None)
        return form if ok else None

    def refused(request: Request) -> Response:
        message = "The form's security token is missing or invalid; nothing was changed. Reload the page and try again."
        return render(request, "error.html", status_code=403, message=message)

    def redirect(target: str) -> RedirectResponse:
        return RedirectResponse(target, status_code=303)

    async def post_action(request: Request, act: Callable[[FormData], Response]) -> Response:
        """Check the CSRF token first; then act in a worker thread, answering refusals with an error page."""
        form = await checked_form(request)
        if form is None:
            return refused(request)
        return await run_in_threadpool(guarded, request, lambda: act(form))

    @router.get("/", name="outboxkit_admin_overview")
    def overview(request: Request) -> Response:
        return render(request, "overview.html", overview=service.overview())

    @router.get("/outboxes/{outbox}", name="outboxkit_admin_rows")
    def rows(
        request: Request,
        outbox: OutboxName,
        status: str = "stuck",
        error_contains: str | None = None,
        status_code: str | None = None,
        cursor: str | None = None,
        done: str | None = None,
        changed: str | None = None,
    ) -> Response:
        def build() -> Response:
            if status not in STATUS_VALUES:
                raise PageInputError(f"status must be one of {', '.join(STATUS_VALUES)}")
            row_filter = _row_filter(error_contains, status_code)
            page = service.rows(outbox, status=status, row_filter=row_filter, cursor=cursor, limit=page_size)
            return render(
                request,
                "rows.html",
                page=page,
                summary=service.outbox_overview(outbox),
                filter_query=row_filter.as_dict(),
                done=done,
                changed=_int_or_none(changed),
            )

        return guarded(request, build)

    @router.get("/outboxes/{outbox}/rows/{row_id}", name="outboxkit_admin_row")
    def row(request: Request, outbox: OutboxName, row_id: RowIdPath, done: str | None = None) -> Response:
        return guarded(request, lambda: render(request, "row.html", row=service.row(outbox, row_id), notice=NOTICES.get(done or "")))

    def row_action(action: str) -> Callable[..., Any]:
        async def act(request: Request, outbox: OutboxName, row_id: RowIdPath, who: Actor) -> Response:
            def build(form: FormData) -> Response:
                perform = service.reset if action == "reset" else service.retry_now
                result = perform(outbox, [row_id], actor=who)
                outcome = action if result.changed else "unchanged"
                return redirect(url(request, "row", {"done": outcome}, outbox=outbox, row_id=row_id))

            return await post_action(request, build)

        return act

    router.add_api_route(
        "/outboxes/{outbox}/rows/{row_id}/reset", row_action("reset"), methods=["POST"], name="outboxkit_admin_reset_row"
    )
    router.add_api_route(
        "/outboxes/{outbox}/rows/{row_id}/retry-now", row_action("retry_now"), methods=["POST"], name="outboxkit_admin_retry_row"
    )

    @router.post("/outboxes/{outbox}/reset-selected", name="outboxkit_admin_reset_selected")
    async def reset_selected(request: Request, outbox: OutboxName, who: Actor) -> Response:
        def build(form: FormData) -> Response:
            try:
                ids = _ids.validate_python({"ids": form.getlist("ids")}).ids
            except ValidationError as exc:
                raise PageInputError(f"bad selection: {exc.errors()[0]['msg']}") from None
            result = service.reset(outbox, ids, actor=who)
            return redirect(url(request, "rows", {"status": "stuck", "done": "selected", "changed": result.changed}, outbox=outbox))

        return await post_action(request, build)

    @router.get("/outboxes/{outbox}/bulk-reset", name="outboxkit_admin_bulk_reset")
    def bulk_reset_confirm(
        request: Request, outbox: OutboxName, who: Actor, error_contains: str | None = None, status_code: str | None = None
    ) -> Response:
        def build() -> Response:
            row_filter = _row_filter(error_contains, status_code)
            preview = service.reset_matching(outbox, row_filter, dry_run=True, actor=who)
            return render(request, "bulk_reset.html", preview=preview, filter_query=row_filter.as_dict())

        return guarded(request, build)

    @router.post("/outboxes/{outbox}/bulk-reset", name="outboxkit_admin_bulk_reset_apply")
    async def bulk_reset_apply(request: Request, outbox: OutboxName, who: Actor) -> Response:
        def build(form: FormData) -> Response:
            fields = {name: form.get(name) for name in ("error_contains", "status_code")}
            row_filter = _row_filter(*(value if isinstance(value, str) else None for value in fields.values()))
            result = service.reset_matching(outbox, row_filter, dry_run=False, actor=who)
            query = {"status": "stuck", "done": "bulk", "changed": result.changed, **row_filter.as_dict()}
            return redirect(url(request, "rows", query, outbox=outbox))

        return await post_action(request, build)

    @router.get("/audit", name="outboxkit_admin_audit")
    def audit(request: Request, outbox: str | None = None, cursor: str | None = None) -> Response:
        def build() -> Response:
            page = service.audit(outbox_name=outbox or None, cursor=cursor, limit=page_size)
            return render(request, "audit.html", page=page, outbox=outbox or None)

        return guarded(request, build)

    @router.get("/jobs", name="outboxkit_admin_jobs")
    def jobs(request: Request) -> Response:
        return render(request, "jobs.html", view=service.jobs())

    @router.get("/static/{name}", name="outboxkit_admin_static")
    def static(name: Annotated[str, Path(max_length=50)]) -> Response:
        if name not in STATIC_FILES:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response(static_file(name), media_type=STATIC_FILES[name], headers={"Cache-Control": "max-age=3600"})

    return router
