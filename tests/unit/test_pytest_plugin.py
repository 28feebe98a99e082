"""The pytest plugin (``celery_durable.testing.pytest_plugin``): a user's test suite, run by pytester.

Each run is a separate ``pytest`` process, so the plugin is loaded the way a user gets it: from
the installed ``pytest11`` entry point, not imported by this module.
"""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]

#: the user's project: the app points at a broker that is not there (the worker fixture replaces it)
SHOP = """
from datetime import timedelta

from celery import Celery

from celery_durable import Durable, DurableTimeoutError, durable_activity
from celery_durable import workflow as wf

app = Celery("shop", broker="redis://127.0.0.1:1/0")
app.conf.update(task_serializer="json", accept_content=["json"], task_ignore_result=True)
durable = Durable(app, store="memory://")


@durable_activity(name="shop.charge")
def charge(order_id: str, cents: int) -> str:
    return f"charged {order_id} {cents}"


@durable.workflow(name="shop.fulfil", signals={"approval": bool})
def fulfil(order_id: str) -> str:
    receipt = charge(order_id, 100)
    wf.sleep(timedelta(days=3))
    try:
        approved = wf.wait_signal("approval", timeout=timedelta(days=1))
    except DurableTimeoutError:
        return "expired"
    return receipt if approved else "refused"


@durable.workflow(name="shop.quick")
def quick(order_id: str) -> str:
    wf.sleep(timedelta(seconds=0.2))  # a short timer: its countdown task runs on the worker
    return charge(order_id, 5)
"""

USER_TESTS = """
from shop import app, durable, fulfil, quick

BEFORE = durable.store  # the app's own (memory) store


def test_time_skipping(durable_env):
    h = durable_env.start(fulfil, "o-1")
    assert durable_env.result(h) == "expired"          # 3 days + 1 day skipped
    h = durable_env.start(fulfil, "o-2")
    durable_env.skip_to_next_timer()
    durable_env.signal(h, "approval", True)
    assert durable_env.result(h) == "charged o-2 100"


def test_real_worker(durable_worker):
    assert durable_worker.durable is durable
    assert durable_worker.store_url.startswith("sqlite:///")
    assert durable.store is not BEFORE
    h = quick.start("o-3")
    assert h.result(timeout=60) == "charged o-3 5"
    assert h.poll().steps == 2
    assert app.conf.broker_url == "filesystem://"


def test_app_is_restored_after_the_worker():
    assert app.conf.broker_url == "redis://127.0.0.1:1/0"
    assert durable.store is BEFORE
"""


def _project(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(shop=SHOP, test_shop=USER_TESTS)
    pytester.syspathinsert()


def test_plugin_is_registered_as_an_entry_point() -> None:
    plugins = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert plugins.get("celery_durable") == "celery_durable.testing.pytest_plugin"


@pytest.mark.worker
def test_fixtures_with_the_ini_option(pytester: pytest.Pytester) -> None:
    _project(pytester)
    pytester.makeini("[pytest]\ndurable_app = shop:durable\n")
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-v", timeout=240)
    result.assert_outcomes(passed=3)


def test_fixtures_with_a_durable_app_fixture(pytester: pytest.Pytester) -> None:
    _project(pytester)
    pytester.makeconftest(
        """
import pytest
import shop

@pytest.fixture
def durable_app():
    return shop.durable
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-k", "time_skipping")
    result.assert_outcomes(passed=1)


def test_ini_option_may_name_the_celery_app(pytester: pytest.Pytester) -> None:
    _project(pytester)
    pytester.makeini("[pytest]\ndurable_app = shop:app\n")
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-k", "time_skipping")
    result.assert_outcomes(passed=1)


def test_without_configuration_the_failure_says_what_to_do(pytester: pytest.Pytester) -> None:
    _project(pytester)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-k", "time_skipping")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(['*set `durable_app = "package.module:durable"` in your pytest configuration*'])


def test_celerys_own_pytest_fixtures_need_no_flag(pytester: pytest.Pytester) -> None:
    """pytest-celery (whose Docker fixtures shadow ``celery.contrib.pytest``'s) is not a dev dependency."""
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert not [d for d in dev if d.startswith("pytest-celery")]
    pytester.makepyfile(
        test_plain="""
import pytest

pytest_plugins = ("celery.contrib.pytest",)

@pytest.fixture(scope="session")
def celery_config():
    return {"broker_url": "memory://", "result_backend": "cache+memory://"}

def test_worker(celery_app, celery_worker):
    @celery_app.task
    def mul(a, b):
        return a * b
    celery_worker.reload()
    assert mul.delay(6, 7).get(timeout=10) == 42
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


@pytest.mark.worker
def test_readme_example_runs_under_pytest(pytester: pytest.Pytester) -> None:
    """docs/guides/testing.md ("Testing with time skipping"): its pytest example, after the blocks it builds on."""
    page = (REPO / "docs" / "guides" / "testing.md").read_text()
    blocks = re.findall(r"<!-- runs -->\n```python\n(.*?)```", page, flags=re.S)
    last = next(i for i, block in enumerate(blocks) if block.startswith("# tests/test_onboarding.py"))
    pytester.makepyfile(test_readme_example="\n".join(blocks[: last + 1]))
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_onboarding_expires PASSED*", "*test_audit_on_a_worker PASSED*"])


@pytest.mark.worker
def test_the_real_worker_fixture_is_quiet_and_tears_down_in_under_a_second(pytester: pytest.Pytester) -> None:
    """Failed before: kombu logged "No hostname was supplied" at WARNING for the filesystem://
    broker, and teardown took ~4 s (Celery's 2 s wait for a message, then its timer's 1 s wait)."""
    _project(pytester)
    pytester.makeini("[pytest]\ndurable_app = shop:durable\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "-k", "real_worker", "--durations=0", "-vv",
        "-o", "log_cli=true", "--log-cli-level=WARNING", timeout=240,
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    assert "No hostname was supplied" not in result.stdout.str() + result.stderr.str()
    (line,) = [ln for ln in result.stdout.lines if "teardown" in ln and "test_real_worker" in ln]
    assert float(line.split("s", 1)[0]) < 1.0, line


def test_a_filesystem_broker_connection_logs_no_hostname_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Failed before: every connection of the worker fixture's ``filesystem://`` broker logged
    kombu's "No hostname was supplied. Reverting to default 'localhost'" at WARNING."""
    from kombu import Connection

    from celery_durable.contrib.filesystem import Transport

    with caplog.at_level("WARNING", logger="kombu.connection"):
        info = dict(Connection("filesystem://", transport=Transport).info())
    assert info["transport"] and not [r for r in caplog.records if "No hostname" in r.getMessage()]
