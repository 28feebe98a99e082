"""Root test configuration.

Service-backed fixtures live in tests/plugins/. In CI (``CI=true``) a missing service fails the
run instead of skipping: see ``require_service``.
"""

from __future__ import annotations

pytest_plugins = ["tests.plugins.cosmos_server", "tests.plugins.workers"]
