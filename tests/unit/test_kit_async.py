"""docs/async.md holds the model, the app and the sync script as ``# file:`` blocks.

The page's code runs in tests/integration/test_kit_async.py.
"""

from __future__ import annotations

from tests.support.doc_pages import page_files


def test_the_page_has_the_model_the_app_and_the_sync_script():
    assert set(page_files("async.md")) == {"shop/models.py", "shop/app.py", "shop/backfill.py"}
