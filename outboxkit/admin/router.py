"""``create_admin_router``: the one entry point of the admin."""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Callable, Collection, Sequence
from typing import Any

from fastapi import APIRouter, HTTPException, Request, params
from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import Scope

from outboxkit.admin.api import MAX_PAGE_SIZE, api_router
from outboxkit.admin.csrf import CsrfTokens
from outboxkit.admin.destination_api import destination_api_router
from outboxkit.admin.export_route import export_router
from outboxkit.admin.flash import FlashNotices
from outboxkit.admin.inbox_api import inbox_api_router
from outboxkit.admin.pages import pages_router
from outboxkit.admin.route_guard import AdminRoute, admin_route_class
from outboxkit.admin.schedule_api import schedule_api_router
from outboxkit.admin.schedule_pages import schedule_pages_router
from outboxkit.admin.signed_values import Signer
from outboxkit.admin.subscription_api import subscription_api_router
from outboxkit.admin.subscription_pages import subscription_pages_router
from outboxkit.errors import ConfigurationError, MigrationRequired
from outboxkit.kit import OutboxKit
from outboxkit.operations.job_status import JobSource
from outboxkit.operations.schedule_admin import ScheduleAdmin
from outboxkit.operations.service import OperationsService
from outboxkit.operations.shared_secrets import ADMIN_SIGNING_KEY, shared_secret
from outboxkit.operations.subscription_admin import SubscriptionAdmin
from outboxkit.telemetry.log_events import log_fields

__all__ = ["ACTOR_STATE_ATTRIBUTE", "create_admin_router"]

logger = logging.getLogger(__name__)

ACTOR_STATE_ATTRIBUTE = "outboxkit_actor"


def actor_from_request_state(request: Request) -> str:
    """The default actor: what the application's auth dependency stored in ``request.state.outboxkit_actor``."""
    value = getattr(request.state, ACTOR_STATE_ATTRIBUTE, None)
    return str(value) if value else "unknown"


class SharedSigningKey:
    """The admin's signing key kept in the kit's database, so every worker and host signs with the same one.

    Fetched on first use (``Signer.ready``).  Without the kit's table it falls back to a key of this process
    alone, says so in the log once, and ``hint`` makes a refused form say why.
    """

    def __init__(self, kit: OutboxKit) -> None:
        self.kit = kit
        self.hint = ""

    def __call__(self) -> bytes:
        try:
            return shared_secret(self.kit, ADMIN_SIGNING_KEY)
        except MigrationRequired as exc:
            self.hint = (
                " This process signs forms with a key of its own, because the kit's table outboxkit_secrets is "
                "missing: a form rendered by another worker is refused until `alembic upgrade heads` runs or "
                "OUTBOXKIT_ADMIN_SECRET is set."
            )
            logger.error("%s; until then each process signs the admin's forms with a key of its own, so a form "
                         "rendered by one worker is refused by another", exc, extra=log_fields("admin.signing_key_local"))
            return secrets.token_bytes(32)


def signing_key(kit: OutboxKit, csrf_secret: str | bytes | None) -> str | bytes | SharedSigningKey:
    """``csrf_secret`` if given, else ``OUTBOXKIT_ADMIN_SECRET``, else the key every process reads from the database."""
    if csrf_secret is not None:
        return csrf_secret
    if kit.settings.admin_secret is not None:
        return kit.settings.admin_secret.get_secret_value()
    return SharedSigningKey(kit)


def _insecure_actor() -> str:
    return "anonymous (insecure_no_auth)"


def create_admin_router(
    kit: OutboxKit,
    *,
    dependencies: Sequence[params.Depends] = (),
    insecure_no_auth: bool = False,
    actor: Callable[..., str] | None = None,
    job_source: JobSource | None = None,
    csrf_secret: str | bytes | None = None,
    page_size: int = 50,
    preview_chars: int = 10_000,
    schedule_jobs: Collection[str] = (),
    include_in_schema: bool = True,
    max_exports: int = 2,
) -> APIRouter:
    """The admin as a FastAPI router; mount it under a prefix of your choice::

        def require_admin(request: Request, credentials = Depends(HTTPBasic())) -> None:
            ...check, raise HTTPException(401) if wrong...
            request.state.outboxkit_actor = credentials.username

        app.include_router(
            create_admin_router(kit, dependencies=[Depends(require_admin)]), prefix="/admin"
        )

    ``dependencies`` guard every route (JSON and pages).  There is no default:
    without one the call raises ``ConfigurationError`` unless
    ``insecure_no_auth=True`` (local development only: refused with
    ``ConfigurationError`` when the kit's settings say ``environment="production"``).

    ``actor`` is a FastAPI dependency returning who acts, for the audit; by
    default it is ``request.state.outboxkit_actor`` as set by your auth
    dependency, else ``"unknown"``.

    ``job_source`` lists the jobs the elected leader runs (see
    ``outboxkit.admin.JobSource``), shown read-only and marked internal on the
    Schedules page and in its API; without it the kit's own registry
    (``kit.scheduler``) lists them.  The deprecated jobs API
    (``/api/jobs``) lists jobs seen in the run history without it.

    ``csrf_secret`` signs the pages' form tokens and flash notices, and names
    their cookies (at least 16 bytes).  Without it the kit's setting
    ``admin_secret`` (``OUTBOXKIT_ADMIN_SECRET``) is used, and without that a
    key the kit generates once and keeps in its table ``outboxkit_secrets``:
    every worker and host reads the same one, so a form rendered by one
    process is accepted by any other with no configuration.

    From the kit's settings: ``admin_max_body_bytes`` caps every POST body
    (413 above it; bodies are read only after ``dependencies`` admitted the
    request) and ``admin_csrf_token_seconds`` is the form tokens' lifetime.
    The admin reads and writes on the kit's ``operator_database``: its own
    pool of ``admin_pool_size`` connections (never the application's) and a
    time limit of ``admin_statement_timeout_seconds`` on each transaction
    (503 "narrow the filter" past it; see docs/admin.md).

    ``schedule_jobs`` are the job names a schedule row may target (the
    names your ``ScheduleRunner`` registers); a job that a schedule row
    already targets is accepted too (see ``outboxkit.operations.schedule_admin``).

    ``page_size`` is the pages' rows per page (the API takes ``limit``, 1 to
    200); ``preview_chars`` caps each payload column in the row detail.

    ``max_exports`` (1 to 100) is how many exports this admin streams at
    once; another gets 429 with ``Retry-After`` (an export's encoding costs
    the CPU the application's requests run on).

    ``include_in_schema=False`` keeps the admin's operations out of the
    host application's OpenAPI schema (its public ``/openapi.json`` and
    ``/docs``); the routes are served and guarded the same.

    Under its prefix the admin answers every path: one it does not have is
    a 404, a method a path does not take a 405 (with ``Allow``), both after
    ``dependencies`` and with the admin's security headers.  So mount it
    under a prefix of its own (a route of yours under the same prefix,
    included after it, would never be reached).
    """
    dependencies = list(dependencies)
    for dependency in dependencies:
        if not isinstance(dependency, params.Depends):
            raise ConfigurationError(f"dependencies must be fastapi.Depends(...) objects, got {dependency!r}")
    if not dependencies and not insecure_no_auth:
        raise ConfigurationError(
            "create_admin_router needs an auth dependency: pass dependencies=[Depends(require_admin)], "
            "where require_admin raises HTTPException(401 or 403) for anyone who may not reset rows. "
            "For local development only, pass insecure_no_auth=True to serve the admin to anyone."
        )
    if not dependencies and kit.settings.is_production:
        raise ConfigurationError(
            "create_admin_router refuses insecure_no_auth=True when the kit's settings say environment='production' "
            "(OUTBOXKIT_ENVIRONMENT): anyone who can reach the admin could reset rows and pause drains. "
            "Pass dependencies=[Depends(require_admin)] with your auth check."
        )
    if not dependencies:
        logger.warning(
            "outboxkit admin is mounted with insecure_no_auth=True: anyone who can reach it can reset rows",
            extra=log_fields("admin.insecure_no_auth"),
        )
    if isinstance(page_size, bool) or not isinstance(page_size, int) or not 1 <= page_size <= MAX_PAGE_SIZE:
        raise ConfigurationError(f"page_size must be an integer from 1 to {MAX_PAGE_SIZE}, got {page_size!r}")
    if isinstance(preview_chars, bool) or not isinstance(preview_chars, int) or not 100 <= preview_chars <= 1_000_000:
        raise ConfigurationError(f"preview_chars must be an integer from 100 to 1000000, got {preview_chars!r}")
    if isinstance(max_exports, bool) or not isinstance(max_exports, int) or not 1 <= max_exports <= 100:
        raise ConfigurationError(f"max_exports must be an integer from 1 to 100, got {max_exports!r}")
    if job_source is not None and not isinstance(job_source, JobSource):
        raise ConfigurationError(f"job_source must have a jobs() -> list[JobInfo] method, got {job_source!r}")
    if isinstance(schedule_jobs, str) or not all(isinstance(job, str) for job in schedule_jobs):
        raise ConfigurationError(f"schedule_jobs must be a collection of job names, got {schedule_jobs!r}")
    try:
        signer = Signer(signing_key(kit, csrf_secret))
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    csrf = CsrfTokens(signer, clock=kit.clock, lifetime_seconds=kit.settings.admin_csrf_token_seconds)
    flashes = FlashNotices(signer, clock=kit.clock)
    route_class = admin_route_class(max_body_bytes=kit.settings.admin_max_body_bytes)
    if actor is None:
        actor = actor_from_request_state if dependencies else _insecure_actor

    service = OperationsService(kit, job_source=job_source, preview_chars=preview_chars)
    refused_by_auth: dict[int | str, dict[str, Any]] = {
        401: {"description": "The application's auth dependency refused the request (no or wrong credentials)."},
        403: {"description": "The application's auth dependency refused the request (not allowed)."},
    }
    router = APIRouter(dependencies=dependencies, responses=refused_by_auth if dependencies else None)
    schedules = ScheduleAdmin(kit, jobs=schedule_jobs, job_source=job_source)
    subscriptions = SubscriptionAdmin(kit)
    parts = (
        api_router(service, actor=actor, route_class=route_class),
        destination_api_router(service, actor=actor, route_class=route_class),
        inbox_api_router(service, route_class=route_class),
        export_router(service, route_class=route_class, max_exports=max_exports),
        schedule_api_router(schedules, actor=actor, route_class=route_class),
        subscription_api_router(subscriptions, actor=actor, route_class=route_class),
        pages_router(service, actor=actor, csrf=csrf, flashes=flashes, page_size=page_size, route_class=route_class),
        schedule_pages_router(
            service, schedules, actor=actor, csrf=csrf, flashes=flashes, page_size=page_size, route_class=route_class
        ),
        subscription_pages_router(
            service, subscriptions, actor=actor, csrf=csrf, flashes=flashes, page_size=page_size, route_class=route_class
        ),
    )
    for part in parts:
        router.include_router(part, include_in_schema=include_in_schema)
    known = [(route.path_regex, route.methods or set()) for part in parts for route in part.routes if isinstance(route, APIRoute)]
    _answer_unknown_paths(router, route_class, known)
    return router


_EVERY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _answer_unknown_paths(
    router: APIRouter, route_class: type[AdminRoute], known: list[tuple[re.Pattern[str], set[str]]]
) -> None:
    """A last route that answers the admin's 404 and 405 itself, so they carry its headers (the host's would not).

    ``known`` are the admin's routes (path pattern below the prefix, methods).
    """

    def unknown_path(path: str) -> None:
        # The first route whose path matches answers for it, as the host's router would have.
        allowed = next((sorted(methods) for pattern, methods in known if pattern.match("/" + path)), None)
        if allowed:
            raise HTTPException(status_code=405, detail="Method Not Allowed", headers={"Allow": ", ".join(allowed)})
        raise HTTPException(status_code=404, detail="Not Found")

    class UnknownAdminPath(route_class):  # type: ignore[valid-type,misc]
        def matches(self, scope: Scope) -> tuple[Match, Scope]:
            match, child_scope = super().matches(scope)
            path, root = scope.get("path", ""), scope.get("root_path", "")
            below_root = path[len(root):] if root and path.startswith(root) else path
            if match is not Match.NONE and below_root == "/" + child_scope["path_params"]["path"]:
                return Match.NONE, {}  # included without a prefix: the host's own paths stay the host's
            return match, child_scope

    router.add_api_route(
        "/{path:path}", unknown_path, methods=_EVERY_METHOD, include_in_schema=False,
        name="outboxkit_admin_unknown_path", route_class_override=UnknownAdminPath,
    )
