"""The example service's admin: the outboxkit admin router behind HTTP Basic auth.

::

    EXAMPLE_ADMIN_PASSWORD=secret uvicorn --factory exampleapp.admin_app:app_from_environment

then open http://127.0.0.1:8000/admin/ and sign in as ``admin``.

``create_app`` builds its own engine and kit over the example outboxes, so it
is self-contained; the service's main app (``exampleapp.app``) mounts the same
router the same way.  The auth dependency checks the credentials and names
the actor for the reset audit through ``request.state.outboxkit_actor``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.security import HTTPBasic, HTTPBasicCredentials

from exampleapp.database import create_example_engine
from exampleapp.models import CreditGrantOutbox, WebhookOutbox
from outboxkit import Clock, ConfigurationError, OutboxKit, OutboxKitSettings, Transport
from outboxkit.admin import ACTOR_STATE_ATTRIBUTE, JobSource, create_admin_router

__all__ = ["app_from_environment", "create_app", "mount_admin", "require_admin"]

basic_auth = HTTPBasic(realm="outboxkit admin", auto_error=False)


def require_admin(username: str, password: str) -> Callable[..., None]:
    """A dependency that admits one user (constant-time compare) and records them as the actor."""
    expected_user, expected_password = username.encode(), password.encode()

    def check(request: Request, credentials: Annotated[HTTPBasicCredentials | None, Depends(basic_auth)]) -> None:
        if credentials is not None:
            user_ok = secrets.compare_digest(credentials.username.encode(), expected_user)
            password_ok = secrets.compare_digest(credentials.password.encode(), expected_password)
            if user_ok and password_ok:
                setattr(request.state, ACTOR_STATE_ATTRIBUTE, credentials.username)
                return
        raise HTTPException(
            status_code=401, detail="admin credentials required", headers={"WWW-Authenticate": 'Basic realm="outboxkit admin"'}
        )

    return check


def create_app(
    database_url: str,
    *,
    admin_user: str = "admin",
    admin_password: str | None = None,
    csrf_secret: str | None = None,
    settings: OutboxKitSettings | None = None,
    clock: Clock | None = None,
    transport: Transport | None = None,
    job_source: JobSource | None = None,
    pool_size: int = 5,
) -> FastAPI:
    """The example admin app.  ``admin_password`` defaults to ``EXAMPLE_ADMIN_PASSWORD``.

    The kit is on ``app.state.outboxkit`` (tests drain through it); the engine
    is disposed and the kit closed when the app shuts down.
    """
    password = admin_password if admin_password is not None else os.environ.get("EXAMPLE_ADMIN_PASSWORD")
    if not password:
        raise ConfigurationError("the example admin needs a password: pass admin_password or set EXAMPLE_ADMIN_PASSWORD")
    engine = create_example_engine(database_url, pool_size=pool_size, max_overflow=0, pool_pre_ping=True)
    kit = OutboxKit(engine, [CreditGrantOutbox, WebhookOutbox], settings=settings, clock=clock, transport=transport)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            kit.close()
            engine.dispose()

    app = FastAPI(title="exampleapp admin", lifespan=lifespan)
    app.state.outboxkit = kit
    app.state.engine = engine
    mount_admin(app, kit, admin_user=admin_user, admin_password=password, csrf_secret=csrf_secret, job_source=job_source)
    return app


def mount_admin(
    app: FastAPI,
    kit: OutboxKit,
    *,
    admin_user: str,
    admin_password: str,
    csrf_secret: str | None = None,
    job_source: JobSource | None = None,
) -> None:
    """Mount the outboxkit admin under ``/admin`` behind HTTP Basic auth.

    Every worker signs the admin's forms with the key the kit keeps in the database, so a form served by
    one worker is accepted by another; ``csrf_secret`` overrides it.
    """
    router = create_admin_router(
        kit,
        dependencies=[Depends(require_admin(admin_user, admin_password))],
        job_source=job_source,
        csrf_secret=csrf_secret,
    )
    app.include_router(router, prefix="/admin")


def app_from_environment() -> FastAPI:
    """``create_app`` from ``DATABASE_URL`` and ``EXAMPLE_ADMIN_PASSWORD`` (for ``uvicorn --factory``)."""
    database_url = os.environ.get("DATABASE_URL")
    if not database_url:
        raise ConfigurationError("set DATABASE_URL, e.g. postgresql+psycopg://user@127.0.0.1:5432/example")
    return create_app(database_url)
