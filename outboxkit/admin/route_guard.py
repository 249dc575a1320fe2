"""The admin's HTTP edge: one route class that every admin route (JSON and pages) uses.

It guarantees, whatever the application's own handlers and middleware do:

* **Security headers** on every answer of an admin route, errors and the
  application's 401s included: a Content-Security-Policy that allows script
  only from the admin's own vendored file (``script-src 'self'``: no inline
  script, no event-handler attributes, nothing from elsewhere) and no framing
  (``frame-ancestors 'none'``), ``X-Frame-Options:
  DENY``, ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``,
  ``Cross-Origin-Resource-Policy: same-origin`` and ``Cache-Control: no-store``
  (the vendored stylesheet, script and icon keep their own ``Cache-Control``:
  they hold no data).
* **A body cap**: a request body is read only when an endpoint asks for it,
  which the admin's endpoints do after the auth dependency has admitted the
  request, and never beyond ``max_body_bytes``: a larger ``Content-Length``
  is refused before a byte is read, a chunked body as soon as it passes the
  cap.  Either way the answer is 413 and nothing changes.
* **Clear errors**: malformed input gets 422 (written ASCII-escaped, so input
  FastAPI's default handler cannot echo, such as a lone surrogate, still gets
  its 422), a database that cannot be reached gets 503 with a message that
  says so, and an unexpected error (a bug) gets 500 with its traceback logged
  on ``outboxkit.admin``: never a bare ``text/plain`` answer without the
  headers.  The JSON API answers them as JSON; a route class made by
  ``with_error_page`` (the pages') answers them with the admin's error page.
  A request over the admin's time limit ("narrow the filter") or its pool
  timeout is a refusal like any other (503).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ClassVar

from fastapi import HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from sqlalchemy import exc as sqlalchemy_errors
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from outboxkit.admin.refusals import REFUSALS, refusal_status
from outboxkit.errors import BodyTooLarge, first_line
from outboxkit.telemetry.log_events import log_fields

__all__ = [
    "DATABASE_UNAVAILABLE_ERRORS",
    "SECURITY_HEADERS",
    "AdminRoute",
    "ErrorPage",
    "BodyTooLarge",
    "admin_route_class",
    "read_json_body",
    "report_database_unavailable",
]

logger = logging.getLogger(__name__)

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: dict[str, str] = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cross-origin-resource-policy": "same-origin",
    "cache-control": "no-store",
}
_ENCODED_HEADERS = [(name.encode(), value.encode()) for name, value in SECURITY_HEADERS.items()]

# Raised by SQLAlchemy when it cannot connect or the connection died
# (OperationalError wraps psycopg's "connection refused"), or when the pool
# has no connection to give (TimeoutError).
DATABASE_UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    sqlalchemy_errors.OperationalError,
    sqlalchemy_errors.InterfaceError,
    sqlalchemy_errors.TimeoutError,
)


def report_database_unavailable(error: Exception) -> str:
    """Log one line about ``error`` (no traceback: it is the database's trouble, not a bug) and return the message to show."""
    logger.warning(
        "outboxkit admin: the database is unreachable: %s",
        first_line(error),
        extra=log_fields("admin.database_unreachable"),
    )
    return (
        "The database is unreachable (connection refused, timed out or lost), so the admin cannot show or change "
        "anything right now. Try again once the database is back."
    )


def _capped_receive(scope: Scope, receive: Receive, limit: int) -> Receive:
    """``receive`` that raises ``BodyTooLarge`` instead of passing on more than ``limit`` body bytes."""
    received = 0
    checked_length = False

    async def capped() -> Message:
        nonlocal received, checked_length
        if not checked_length:
            checked_length = True
            for name, value in scope.get("headers", ()):
                if name == b"content-length":
                    length = value.strip()
                    if not length.isdigit():  # bytes.isdigit() is ASCII-only
                        raise HTTPException(status_code=400, detail="the Content-Length header is not a number")
                    if int(length) > limit:
                        raise BodyTooLarge(limit)
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise BodyTooLarge(limit)
        return message

    return capped


def _headed_send(send: Send) -> Send:
    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            present = {name.lower() for name, _ in headers}
            headers += [(name, value) for name, value in _ENCODED_HEADERS if name not in present]
            message = {**message, "headers": headers}
        await send(message)

    return send_with_headers


def _json_error(status_code: int, detail: Any) -> Response:
    body = json.dumps({"detail": jsonable_encoder(detail)}, ensure_ascii=True, default=str)
    return Response(body, status_code=status_code, media_type="application/json")


UNEXPECTED_ERROR_MESSAGE = (
    "The admin hit an unexpected error answering this request; it is logged on the server (logger outboxkit.admin). "
    "If this was a change, check its result before trying again."
)

# Renders an error as a page: (request, status code, message, heading) -> response.
ErrorPage = Callable[[Request, int, str, str], Response]


def validation_message(errors: Sequence[Any]) -> str:
    """FastAPI's validation errors in one sentence, e.g. ``bad row_id: Input should be a valid integer``."""
    problems = []
    for error in errors[:3]:
        where = [str(part) for part in error.get("loc", ()) if part not in ("path", "query", "body")]
        problems.append(f"bad {'.'.join(where) or 'input'}: {error.get('msg', 'invalid value')}")
    return "; ".join(problems) or "bad input"


def sign_in_message(errors: Sequence[Any]) -> str:
    """A validation error of the application's auth dependency, said as such (the admin reads no header or cookie)."""
    problems = [
        f"{' '.join(str(part) for part in error.get('loc', ()))}: {error.get('msg', 'invalid value')}" for error in errors[:3]
    ]
    return (
        f"the application's sign-in could not read this request: {'; '.join(problems)}. "
        "Sign in as your application expects (the admin itself reads no header or cookie)."
    )


def _from_sign_in(errors: Sequence[Any]) -> bool:
    """The admin's routes declare no header or cookie: such a validation error comes from the auth dependency."""
    return bool(errors) and all(tuple(error.get("loc", ()))[:1] in (("header",), ("cookie",)) for error in errors)


class AdminRoute(APIRoute):
    """Adds the admin's headers, body cap and error answers to a FastAPI route (see the module)."""

    max_body_bytes: ClassVar[int] = 64 * 1024
    # None: errors are answered as JSON (the API); the pages' route class renders them (``with_error_page``).
    error_page: ClassVar[ErrorPage | None] = None

    @classmethod
    def with_error_page(cls, error_page: ErrorPage) -> type[AdminRoute]:
        """This route class, answering its errors with ``error_page`` instead of JSON."""
        return type("AdminPageRoute", (cls,), {"error_page": staticmethod(error_page)})

    @classmethod
    def error_answer(cls, request: Request, status_code: int, detail: Any, heading: str = "Not done") -> Response:
        if cls.error_page is None:
            return _json_error(status_code, detail)
        message = detail if isinstance(detail, str) else validation_message(detail)
        return cls.error_page(request, status_code, message, heading)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            receive = _capped_receive(scope, receive, self.max_body_bytes)
            send = _headed_send(send)
        await super().handle(scope, receive, send)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        answer = self.error_answer
        pages = type(self).error_page is not None  # a page says who refused; the API keeps FastAPI's shape

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except StarletteHTTPException:  # the application's 401/403 and the API's refusals: answered by FastAPI
                raise
            except RequestValidationError as exc:
                if pages and _from_sign_in(exc.errors()):  # the application's auth dependency, not the admin's input
                    return answer(request, 422, sign_in_message(exc.errors()), "Not signed in")
                return answer(request, 422, exc.errors())
            except BodyTooLarge as exc:
                return answer(request, 413, str(exc))
            except REFUSALS as exc:  # e.g. the admin's time limit on a route that does not map refusals itself
                return answer(request, refusal_status(exc), str(exc))
            except DATABASE_UNAVAILABLE_ERRORS as exc:
                return answer(request, 503, report_database_unavailable(exc), "Database unreachable")
            except Exception:
                logger.exception(
                    "outboxkit admin: unexpected error answering %s %s",
                    request.method,
                    request.url.path,
                    extra=log_fields("admin.unexpected_error"),
                )
                return answer(request, 500, UNEXPECTED_ERROR_MESSAGE, "Something went wrong")

        return handle


def admin_route_class(*, max_body_bytes: int) -> type[AdminRoute]:
    """An ``AdminRoute`` with its own body cap (one per admin router)."""
    return type("AdminRoute", (AdminRoute,), {"max_body_bytes": max_body_bytes})


async def read_json_body(request: Request, model: type[BaseModel]) -> Any:
    """The request body as ``model``, read now (after auth), capped, strictly validated.

    413 over the cap, 400 when the body is not UTF-8, 422 when it is not JSON
    or does not fit the model (the model's strict types decide: ``"1"``,
    ``1.0`` and ``true`` are not ids, ``"no"`` and ``0`` are not booleans).
    """
    body = await request.body()  # BodyTooLarge -> 413 in AdminRoute
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(status_code=400, detail="the body is not UTF-8 text") from None
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None
