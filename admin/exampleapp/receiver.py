"""The demo's receiver: a small, unreliable billing endpoint on 127.0.0.1.

It accepts most requests, answers some with 503 (retried), rejects some
with 400 (those rows become ``stuck``) and hangs on a few (the drain's
timeout turns them into retries).  It drops duplicates by
``Idempotency-Key``, as a real receiver should, and logs one line per
request.  Run it with ``python -m exampleapp.receiver --port 8765``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
from typing import Any

logger = logging.getLogger("exampleapp.receiver")


class UnreliableReceiver:
    """An ASGI app; the odds are per request, so a reset row may well pass next time."""

    def __init__(self, *, reject: float = 0.08, fail: float = 0.12, hang: float = 0.02, hang_seconds: float = 30.0,
                 seed: int | None = None) -> None:
        self.reject, self.fail, self.hang, self.hang_seconds = reject, fail, hang, hang_seconds
        self.seen: set[str] = set()
        self._random = random.Random(seed)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {name.decode().lower(): value.decode() for name, value in scope["headers"]}
        key = headers.get("idempotency-key", "")
        status, answer = await self.decide(key, body)
        logger.info("%s %s key=%s -> %s", scope["method"], scope["path"], key[:8], status)
        payload = json.dumps(answer).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    async def decide(self, key: str, body: bytes) -> tuple[int, dict[str, Any]]:
        if key and key in self.seen:
            return 200, {"status": "duplicate ignored"}
        roll = self._random.random()
        if roll < self.hang:
            await asyncio.sleep(self.hang_seconds)
            return 504, {"error": "took too long"}
        if roll < self.hang + self.reject:
            return 400, {"error": "amount rejected by billing rules"}
        if roll < self.hang + self.reject + self.fail:
            return 503, {"error": "billing is busy, try later"}
        if key:
            self.seen.add(key)
        return 200, {"status": "accepted"}


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--reject", type=float, default=0.08)
    parser.add_argument("--fail", type=float, default=0.12)
    parser.add_argument("--hang", type=float, default=0.02)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="receiver: %(message)s")
    app = UnreliableReceiver(reject=args.reject, fail=args.fail, hang=args.hang)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
