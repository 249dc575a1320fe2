"""The CPU cost of signing a request (Standard Webhooks, outboxkit.transports.signing).

Measures what ``SigningTransport`` adds to one send: the HMAC-SHA256 over
``id.timestamp.body``, the base64, and the copy of the ``Delivery`` that
carries the three headers.  Process CPU time (``time.process_time``), no
network, no database, the best of five rounds of ``--rows`` signings:

* one secret, a typical body (about 500 bytes of JSON): ``signing_cpu_us_per_row``;
* two secrets (a rotation under way): ``signing_cpu_us_per_row_two_secrets``;
* one secret, an 8 KB body: ``signing_cpu_us_per_row_8kb``.

Run::

    .venv/bin/python bench/signing.py            # about two seconds

The last line is one JSON object with those keys (microseconds per row).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from outboxkit import CallableTransport, Delivery  # noqa: E402
from outboxkit.transports.signing import SigningTransport, WebhookSecrets  # noqa: E402

SECRETS = ["whsec_" + "QmVuY2htYXJrLXNlY3JldC1udW1iZXItb25lLTEyMzQ=", "whsec_" + "QmVuY2htYXJrLXNlY3JldC1udW1iZXItdHdvLTU2Nzg="]
ROUNDS = 5


def delivery_of(size: int) -> Delivery:
    items = [{"sku": f"SKU-{index:05d}", "quantity": index % 7, "note": "x" * 20} for index in range(max(1, size // 60))]
    return Delivery(url="http://127.0.0.1:1/hook", json={"order": 12345, "items": items}, headers={"X-Kind": "order"})


def microseconds_per_row(secrets: list[str], delivery: Delivery, rows: int) -> float:
    signer = SigningTransport(CallableTransport(lambda sent, key: 200), WebhookSecrets(secrets))
    keys = [str(uuid.uuid4()) for _ in range(rows)]
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.process_time()
        for key in keys:
            signer.sign(delivery, idempotency_key=key)
        best = min(best, time.process_time() - started)
    return best / rows * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000)
    options = parser.parse_args()
    typical, large = delivery_of(500), delivery_of(8 * 1024)
    figures = {
        "signing_cpu_us_per_row": microseconds_per_row(SECRETS[:1], typical, options.rows),
        "signing_cpu_us_per_row_two_secrets": microseconds_per_row(SECRETS, typical, options.rows),
        "signing_cpu_us_per_row_8kb": microseconds_per_row(SECRETS[:1], large, options.rows),
        "typical_body_bytes": len(typical.body() or b""),
        "large_body_bytes": len(large.body() or b""),
        "rows": options.rows,
    }
    for name, value in figures.items():
        print(f"{name}: {value:.2f}" if isinstance(value, float) else f"{name}: {value}")
    print(json.dumps({name: round(value, 2) if isinstance(value, float) else value for name, value in figures.items()}))


if __name__ == "__main__":
    main()
