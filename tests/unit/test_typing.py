"""mypy checks the arguments of workflows and activities, and types ``h.result()``.

A snippet is type-checked with mypy's API: each line marked ``# E`` must be reported, no other
line may be, and the ``reveal_type`` notes must name the workflow's return type.
"""

from __future__ import annotations

import re
from pathlib import Path

from mypy import api

REPO = Path(__file__).resolve().parents[2]

SNIPPET = """
from celery import Celery
from celery_durable import Durable, durable_activity

app = Celery("typing")
durable = Durable(app, store="memory://")

@durable_activity
def add(a: int, b: int) -> int:
    return a + b

@durable_activity(name="typing.mul")
def mul(a: int, b: int) -> int:
    return a * b

@durable.workflow
def child(x: int) -> str:
    return str(x)

@durable.workflow(name="typing.parent")
def parent(x: int, label: str = "a") -> list[int]:
    add(1, "2")  # E
    mul("1", 2)  # E
    add.start(1, 2).result()
    add.start(1, "2")  # E
    child(1)
    child("1")  # E
    child(1, 2)  # E
    child.start_child(1).result()
    child.start_child("1")  # E
    child.start_child(1, _workflow_id="c-1")
    child.options(workflow_id="c-2").start_child(1)
    child.options(workflow_id="c-3").start_child("1")  # E
    reveal_type(child.start_child(1).result())  # R str
    return [add(1, 2)]

parent.start(1)
parent.start(1, "b")
parent.start(1, label="b")
parent.start("1")  # E
parent.start(1, lbl="b")  # E
parent.start()  # E
parent.start(1, _workflow_id="order-1")  # E
parent.start("1", _workflow_id="order-1")  # E
h = parent.options(workflow_id="order-1").start(1)
parent.options(workflow_id="order-2").start(1, label="c")
parent.options(workflow_id="order-3").start("1")  # E
reveal_type(h)  # R celery_durable.handle.WorkflowHandle[list[int]]
reveal_type(h.result(timeout=1))  # R list[int]
reveal_type(parent.start(2).result())  # R list[int]
reveal_type(parent.options(workflow_id="x").start(2).result())  # R list[int]
reveal_type(durable.handle("order-1").result())  # R Any
"""


def _mypy(tmp_path: Path) -> tuple[str, list[str]]:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(SNIPPET)
    config = tmp_path / "mypy.ini"
    # celery_durable is read from the source tree (an editable install hides it from mypy);
    # its own modules are checked by the package's mypy run, not reported here
    config.write_text(
        f"[mypy]\nstrict = True\nignore_missing_imports = True\nmypy_path = {REPO}\n"
        "[mypy-celery_durable.*]\nfollow_imports = silent\n"
    )
    out, err, _ = api.run(
        [str(snippet), "--config-file", str(config), "--cache-dir", str(tmp_path / "cache"), "--no-error-summary"]
    )
    return out + err, SNIPPET.splitlines()


def test_wrong_arguments_are_reported_and_results_typed(tmp_path: Path) -> None:
    output, lines = _mypy(tmp_path)
    errors = {int(m.group(1)) for m in re.finditer(r"snippet\.py:(\d+): error:", output)}
    expected = {n for n, line in enumerate(lines, 1) if line.endswith("# E")}
    assert errors == expected, (
        f"\nreported but not marked: {[lines[n - 1] for n in sorted(errors - expected)]}"
        f"\nmarked but not reported: {[lines[n - 1] for n in sorted(expected - errors)]}\n{output}"
    )
    notes = re.finditer(r'snippet\.py:(\d+): note: Revealed type is "(.*)"', output)
    revealed = {int(m.group(1)): m.group(2) for m in notes}
    wanted = {n: line.split("# R ")[1] for n, line in enumerate(lines, 1) if "# R " in line}
    assert revealed == wanted, output
