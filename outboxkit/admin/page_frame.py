"""What every admin page and action is answered with: rendering, cookies, refusals as error pages, the POST discipline.

A page renders its template with the CSRF token (reissued when missing or
stale) and shows a flash notice once.  An action reads its form (capped),
checks the CSRF token for the signed-in actor before anything else (403,
nothing read or written), runs in a worker thread, and answers with a 303
redirect whose notice travels in a signed flash cookie scoped to the mount
path.  A refusal of the service becomes an error page with the status of
``outboxkit.admin.refusals``; an unreachable database, a 503 page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData

from outboxkit.admin.csrf import CSRF_FIELD, CsrfTokens
from outboxkit.admin.flash import FLASH_SECONDS, Flash, FlashNotices
from outboxkit.admin.page_inputs import form_text
from outboxkit.admin.refusals import REFUSALS, refusal_status
from outboxkit.admin.rendering import make_environment
from outboxkit.admin.route_guard import DATABASE_UNAVAILABLE_ERRORS, AdminRoute, report_database_unavailable
from outboxkit.errors import BodyTooLarge
from outboxkit.operations.schemas import MAX_BULK_IDS
from outboxkit.operations.service import OperationsService

__all__ = ["PageFrame", "PageRoutes"]

# A stand-in for a path parameter while a route's path is looked up: plain letters, which every path
# parameter of the admin's routes (str or path) accepts, and which no route's own path contains.
_PARAMETER_MARK = "OutboxkitAdminParameter{}X"


def _route_path(request: Request, route: str, names: list[str]) -> str:
    """The path of the admin route ``route`` as a format string over its path parameters ``names``.

    Starlette's ``url_for`` walks every route of the application for each call (about 0.7 ms with the
    admin's routes), and a list page asks for hundreds of links.  So each route's path is looked up
    once per request, with marks for its parameters, and each link fills the marks in.  Per request,
    not per router: the path depends on where this request's application mounted the admin.
    """
    paths: dict[tuple[str, tuple[str, ...]], str] | None = getattr(request.state, "outboxkit_admin_paths", None)
    if paths is None:
        paths = {}
        request.state.outboxkit_admin_paths = paths
    key = (route, tuple(names))
    found = paths.get(key)
    if found is None:
        marks = {name: _PARAMETER_MARK.format(index) for index, name in enumerate(names)}
        found = request.url_for(f"outboxkit_admin_{route}", **marks).path.replace("{", "{{").replace("}", "}}")
        for name, mark in marks.items():
            found = found.replace(mark, "{" + name + "}")
        paths[key] = found
    return found


class PageFrame:
    """Renders pages and answers actions for the admin's HTML routes over ``service``."""

    def __init__(self, service: OperationsService, *, csrf: CsrfTokens, flashes: FlashNotices, environment: Environment) -> None:
        self.service = service
        self.csrf = csrf
        self.flashes = flashes
        self.environment = environment

    def url(self, request: Request, route: str, query: dict[str, Any] | None = None, **path_params: Any) -> str:
        # Percent-encoded, so a job id like "reports/daily" or "sync?x=1" stays one path parameter.
        quoted = {name: quote(str(value), safe="") for name, value in path_params.items()}
        path = _route_path(request, route, sorted(quoted)).format_map(quoted)
        pairs = {key: value for key, value in (query or {}).items() if value not in (None, "")}
        return f"{path}?{urlencode(pairs)}" if pairs else path

    def mount_path(self, request: Request) -> str:
        """Where the application mounted the admin: the cookies' Path."""
        return self.url(request, "overview").rstrip("/") or "/"

    def set_cookie(self, response: Response, request: Request, name: str, value: str, max_age: int) -> None:
        response.set_cookie(
            name,
            value,
            max_age=max_age,
            path=self.mount_path(request),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def render(self, request: Request, who: str, template: str, *, status_code: int = 200, **context: Any) -> HTMLResponse:
        csrf, flashes = self.csrf, self.flashes
        if not csrf.has_key():  # the database that keeps the key is away: a page whose forms carry no token
            return HTMLResponse(self._html(request, template, csrf_token="", notice=None, **context), status_code=status_code)
        mount = self.mount_path(request)
        csrf_cookie = csrf.cookie_name(mount)
        token = request.cookies.get(csrf_cookie)
        reissue = token is None or not csrf.is_fresh(token, actor=who, mount_path=mount)
        if reissue or token is None:
            token = csrf.issue(actor=who, mount_path=mount)
        flash_cookie = flashes.cookie_name(mount)
        flash_value = request.cookies.get(flash_cookie)
        flash = flashes.decode(flash_value, actor=who, mount_path=mount) if flash_value else None
        html = self._html(request, template, csrf_token=token, notice=flash.message if flash else None, **context)
        response = HTMLResponse(html, status_code=status_code)
        if reissue:
            self.set_cookie(response, request, csrf_cookie, token, csrf.lifetime_seconds)
        if flash_value is not None:  # shown (or worthless): either way, only once
            response.delete_cookie(
                flash_cookie, path=mount, httponly=True, samesite="strict", secure=request.url.scheme == "https"
            )
        return response

    def _html(self, request: Request, template: str, **context: Any) -> str:
        return self.environment.get_template(template).render(
            url=lambda route, query=None, **params: self.url(request, route, query, **params),
            now=self.service.kit.clock.now(),
            csrf_field=CSRF_FIELD,
            outbox_names=self.service.outbox_names,
            **context,
        )

    def error_page(self, request: Request, who: str, status_code: int, message: str, heading: str = "Not done") -> HTMLResponse:
        return self.render(request, who, "error.html", status_code=status_code, message=message, heading=heading)

    def route_error_page(self, request: Request, status_code: int, message: str, heading: str) -> HTMLResponse:
        """The error page for what the route itself answers (a malformed path, a bug): no actor is known, no cookie is touched."""
        html = self._html(request, "error.html", csrf_token="", notice=None, message=message, heading=heading)
        return HTMLResponse(html, status_code=status_code)

    def guarded(self, request: Request, who: str, build: Callable[[], Response]) -> Response:
        """Answer the service's refusals, and a database that is away, with an error page instead of a stack trace."""
        try:
            self.csrf.ready()  # the forms' signing key, from the database the first time
            return build()
        except REFUSALS as exc:
            return self.error_page(request, who, refusal_status(exc), str(exc))
        except DATABASE_UNAVAILABLE_ERRORS as exc:
            return self.error_page(request, who, 503, report_database_unavailable(exc), heading="Database unreachable")

    def redirect(self, request: Request, who: str, target: str, flash: Flash) -> RedirectResponse:
        response = RedirectResponse(target, status_code=303)
        mount = self.mount_path(request)
        cookie = self.flashes.cookie_name(mount)
        self.set_cookie(response, request, cookie, self.flashes.encode(flash, actor=who, mount_path=mount), FLASH_SECONDS)
        return response

    async def post_action(self, request: Request, who: str, act: Callable[[FormData], Response]) -> Response:
        """Read the form (capped), check the CSRF token; then act in a worker thread, refusals as error pages."""
        try:
            await run_in_threadpool(self.csrf.ready)  # the forms' signing key, from the database the first time
        except DATABASE_UNAVAILABLE_ERRORS as exc:
            return self.error_page(request, who, 503, report_database_unavailable(exc), heading="Database unreachable")
        try:
            form = await request.form(max_fields=2 * MAX_BULK_IDS + 10)  # ids and page_ids
        except BodyTooLarge as exc:
            return self.error_page(request, who, 413, str(exc))
        mount = self.mount_path(request)
        cookie = request.cookies.get(self.csrf.cookie_name(mount))
        if not self.csrf.accepts(cookie=cookie, submitted=form_text(form, CSRF_FIELD), actor=who, mount_path=mount):
            message = (
                "The form's security token is missing, invalid or expired; nothing was changed. Reload the page and try again."
                + self.csrf.refusal_hint()
            )
            return self.error_page(request, who, 403, message)
        return await run_in_threadpool(self.guarded, request, who, lambda: act(form))


@dataclass(frozen=True)
class PageRoutes:
    """What each ``add_*`` function of the pages adds its route with."""

    router: APIRouter
    frame: PageFrame
    service: OperationsService
    actor: Callable[..., str]
    page_size: int

    @classmethod
    def create(
        cls,
        service: OperationsService,
        *,
        actor: Callable[..., str],
        csrf: CsrfTokens,
        flashes: FlashNotices,
        page_size: int,
        route_class: type[AdminRoute],
    ) -> PageRoutes:
        """A router of pages (left out of the OpenAPI schema) whose errors render as error pages, and its frame."""
        frame = PageFrame(service, csrf=csrf, flashes=flashes, environment=make_environment())
        router = APIRouter(include_in_schema=False, route_class=route_class.with_error_page(frame.route_error_page))
        return cls(router=router, frame=frame, service=service, actor=actor, page_size=page_size)

