"""The example service: a FastAPI app that writes grants and lets outboxkit deliver them.

Run it with several workers; exactly one of them leads and runs the schedule::

    DATABASE_URL=postgresql://root@127.0.0.1:5432/example \\
        uvicorn exampleapp.app:app --workers 2 --app-dir admin

``create_app`` builds everything from its arguments; the module-level ``app``
(what uvicorn imports) is built on first access from ``DATABASE_URL``, so
importing ``create_app`` needs no environment.  Settings (intervals, the
advisory key, the environment) come from ``OUTBOXKIT_*`` variables; the
service runs as ``production`` (a failed leader election starts no
scheduler) unless ``OUTBOXKIT_ENVIRONMENT`` says otherwise, as the local demo
does.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from exampleapp.admin_app import mount_admin
from exampleapp.database import create_example_engine
from exampleapp.models import CreditGrantOutbox, Grant, WebhookOutbox
from outboxkit import Outbox, OutboxKit, OutboxKitSettings

__all__ = ["create_app", "kit_from_environment", "service_settings"]

# Annotated: mypy would infer list[type[Base]] (the classes' common base), which OutboxKit(outboxes=...) refuses.
OUTBOXES: list[type[Outbox]] = [CreditGrantOutbox, WebhookOutbox]


class GrantRequest(BaseModel):
    workspace: str = Field(min_length=1, max_length=100)
    amount: int = Field(gt=0)


def create_app(
    database_url: str,
    *,
    settings: OutboxKitSettings | None = None,
    admin_user: str = "admin",
    admin_password: str | None = None,
    csrf_secret: str | None = None,
) -> FastAPI:
    """The service: its routes, the kit and the kit's lifespan (election and scheduler).

    The outboxkit admin is mounted at ``/admin`` behind HTTP Basic auth when an
    admin password is given (``admin_password`` or ``EXAMPLE_ADMIN_PASSWORD``);
    without one the service runs without an admin rather than an open one.
    """
    if not logging.getLogger().handlers:  # a bare uvicorn configures only its own loggers
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    engine = create_example_engine(database_url, pool_size=5, max_overflow=5)
    kit = OutboxKit(engine, outboxes=OUTBOXES, settings=settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with kit.lifespan(app):
            yield
        engine.dispose()

    app = FastAPI(title="exampleapp", lifespan=lifespan)
    app.state.kit = kit
    password = admin_password if admin_password is not None else os.environ.get("EXAMPLE_ADMIN_PASSWORD")
    if password:
        # The scheduler's registry is the same in every worker, leader or not.
        mount_admin(app, kit, admin_user=admin_user, admin_password=password, csrf_secret=csrf_secret,
                    job_source=kit.scheduler)
    else:
        logging.getLogger("exampleapp").warning("EXAMPLE_ADMIN_PASSWORD is not set: the admin is not mounted")

    @app.get("/health")
    def health() -> dict[str, str]:
        election = kit.scheduler.election
        return {"status": "ok", "election": election.state.value if election is not None else "off"}

    @app.post("/grants", status_code=201)
    def create_grant(request: GrantRequest) -> dict[str, int]:
        # The business row and its outbox row commit together, or neither does.
        with Session(engine) as session, session.begin():
            grant = Grant(workspace=request.workspace, amount=request.amount)
            session.add(grant)
            session.flush()
            grant_id = grant.id
            session.add(CreditGrantOutbox(grant_id=grant_id, workspace=grant.workspace, amount=grant.amount))
        return {"grant_id": grant_id}

    return app


def __getattr__(name: str) -> FastAPI:
    # ``uvicorn exampleapp.app:app`` reads the attribute; build it once, from the environment.
    if name != "app":
        raise AttributeError(name)
    database_url = os.environ.get("DATABASE_URL")
    if not database_url:
        raise RuntimeError("set DATABASE_URL (e.g. postgresql://root@127.0.0.1:5432/example) to run exampleapp.app")
    application = create_app(database_url, settings=service_settings())
    globals()["app"] = application
    return application


def service_settings() -> OutboxKitSettings:
    """The ``OUTBOXKIT_*`` settings, in ``production`` unless ``OUTBOXKIT_ENVIRONMENT`` is set.

    The kit's own default is ``development`` (fail open, for a laptop); a
    service deployed as this one is must fail closed, so it says so itself.
    """
    settings = OutboxKitSettings.from_environment()
    if "environment" not in settings.model_fields_set:
        settings = settings.model_copy(update={"environment": "production"})
    return settings


def kit_from_environment() -> OutboxKit:
    """The example's kit from ``DATABASE_URL``, for the CLI: ``outboxkit --app exampleapp.app:kit_from_environment status``."""
    database_url = os.environ.get("DATABASE_URL")
    if not database_url:
        raise RuntimeError("set DATABASE_URL (e.g. postgresql://root@127.0.0.1:5432/example)")
    return OutboxKit(create_example_engine(database_url, pool_size=2), outboxes=OUTBOXES)
