"""Root test configuration.

Service-backed fixtures live in tests/plugins/. In CI (``CI=true``) a missing service fails the
run instead of skipping: see ``require_service``.

Markers are given here, from what a test uses and where it lives, so none can be forgotten:
``worker`` (starts real ``celery worker`` processes), ``postgres`` / ``cosmos`` (needs that
server, also when a store fixture is parametrized over it), ``slow`` (everything left out of the
inner loop of CONTRIBUTING.md), ``adversarial`` (a review's attempt to break a promise) and
``regression`` (a bug found once, kept from coming back).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.plugins.cosmos_server", "tests.plugins.workers", "tests.plugins.records"]

TESTS = Path(__file__).resolve().parent

#: fixture -> the marker a test using it gets
FIXTURE_MARKS = {
    "worker_factory": "worker",
    "cluster": "worker",
    "_cosmos_server_session": "cosmos",
    "cosmos_server": "cosmos",
    "cosmos_url": "cosmos",
    "_postgres_server": "postgres",
    "postgres_url": "postgres",
    "postgres_schema": "postgres",
    "postgres_proxy": "postgres",
    "postgres_proxied_url": "postgres",
}

#: folders and files whose tests are slow (measured: together they are most of the suite's time)
SLOW_PLACES = ("integration", "sim", "test_example_project.py")
#: further files slower than the inner loop can carry (seconds measured on the 2-core CI machine)
SLOW_FILES = frozenset(
    {
        "stores/test_chunk_gc_breaks.py",  # 155 s
        "unit/test_pytest_plugin.py",  # 27 s: runs pytest in subprocesses
        "engine/test_pending_ops.py",  # 29 s: hypothesis over crash points
    }
)
#: single tests over 0.7 s each (measured in a full run; together about 100 s of the rest)
SLOW_TESTS = frozenset(
    {
        "stores/test_contract.py::test_first_writer_wins_across_processes",
        "stores/test_contract_chunk_gc.py::test_a_collector_racing_writers_never_deletes_a_referenced_chunk",
        "stores/test_contract.py::test_processes_can_start_together_on_a_fresh_store",
        "engine/test_rerun_effects_property.py::test_every_emit_of_the_final_run_is_enqueued_once_or_told",
        "engine/test_regressions_replay.py::test_payload_decodes_to_the_binding_of_the_direct_call",
        "engine/test_purging.py::test_a_purge_cut_at_any_batch_is_recorded_and_finished_by_whoever_comes_next",
        "engine/test_regressions_outbox_runtime.py::test_a_slow_renew_of_one_handler_does_not_delay_the_timeout_of_another",
        "stores/test_contract_large.py::test_a_big_document_round_trips",
        "stores/test_contract_large.py::test_replace_big_small_big_keeps_only_the_current_chunks",
        "stores/test_sqlite_wait.py::test_many_processes_writing_at_once_all_succeed",
        "unit/test_typing.py::test_wrong_arguments_are_reported_and_results_typed",
        "engine/test_regressions_outbox_adversarial.py::test_cancel_misses_an_unadmitted_intent_behind_a_thousand_others",
        "stores/test_result_push_breaks.py::test_a_waiter_goes_back_to_push_once_the_listener_is_back",
        "stores/test_contract_chunk_gc.py::test_chunks_of_a_write_that_never_committed_are_collected_after_the_grace",
        "engine/test_sticky_breaks.py::test_every_drive_of_wide_workflows_decides_what_a_full_replay_decides",
        "unit/test_imports.py::test_the_graph_reader_sees_imports",
        "stores/test_contract_chunk_gc.py::test_chunks_a_committed_write_did_not_drop_are_collected",
        "stores/test_offload_breaks.py::test_racing_upserts_of_a_big_document_leave_no_orphan_chunks",
        "stores/test_contract_large.py::test_a_batch_with_big_documents",
        "stores/test_contract_chunk_gc.py::test_referenced_chunks_survive_and_are_looked_at_once",
        "ui/test_access.py::test_the_cli_on_every_interface",
        "ui/test_access.py::test_no_anonymous_or_rebound_request_ever_reads_a_payload",
        "unit/test_wire.py::test_random_configurations_never_send_pickle",
        "engine/test_heartbeat_reuse.py::test_leases_are_renewed_after_the_engine_was_shut_down_and_used_again",
        "unit/test_codecs_fidelity.py::test_a_value_is_carried_exactly_or_refused_never_changed",
        "stores/test_contract_azure_limits.py::test_the_offloading_store_keeps_a_big_batch_under_the_limit",
        "unit/test_message_boundary_breaks.py::test_auth_signing_over_pickle_still_sends_pickle",
        "engine/test_sticky.py::test_an_uncommitted_replay_is_never_resumed",
        "stores/test_result_push_breaks.py::test_fifty_waiters_in_threads_share_one_listener_and_leave_nothing_behind",
        "stores/test_contract_large.py::test_delete_removes_the_chunks",
        "stores/test_contract_search.py::test_a_big_exec_keeps_its_attributes_indexed",
        "unit/test_docs_site.py::test_the_site_builds_strict",
        "stores/test_offload_breaks.py::test_batch_with_one_unicode_heavy_doc_commits",
        "engine/test_oplog.py::test_a_big_forgotten_history_is_archived_capped_never_failing",
        "engine/test_oplog_property.py::test_nothing_that_ran_is_forgotten_under_random_operations",
        "stores/test_contract_large.py::test_a_missing_or_corrupt_chunk_is_a_clear_error_not_a_wrong_value",
        "stores/test_contract.py::test_document_just_under_the_limit_is_accepted",
        "stores/test_contract_large.py::test_a_reader_racing_a_replace_gets_the_new_version",
        "engine/test_chunk_collection.py::test_recovery_deletes_chunks_of_a_write_that_died_and_keeps_the_result",
        "stores/test_result_push_breaks.py::test_two_threads_first_subscribing_after_a_fork_start_one_listener",
    }
)


def marks_for(rel: Path, name: str, fixtures: set[str], param_id: str) -> set[str]:
    """The markers of test ``name`` at ``rel`` (under tests/) using ``fixtures``, parametrized as ``param_id``."""
    marks = {mark for fixture, mark in FIXTURE_MARKS.items() if fixture in fixtures}
    if f"{rel.as_posix()}::{name}" in SLOW_TESTS:
        marks.add("slow")
    for service in ("cosmos", "postgres"):
        if service in param_id.lower():
            marks.add(service)
    if "breaks" in rel.name or "adversarial" in rel.name:
        marks.add("adversarial")
    if "regression" in rel.name:
        marks.add("regression")
    if rel.parts[0] in SLOW_PLACES or rel.name in SLOW_PLACES or rel.as_posix() in SLOW_FILES:
        marks.add("slow")
    if marks & {"worker", "cosmos", "postgres"}:
        marks.add("slow")
    return marks


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        rel = Path(item.path).resolve().relative_to(TESTS)
        callspec = getattr(item, "callspec", None)
        fixtures = set(getattr(item, "fixturenames", ()))
        name = getattr(item, "originalname", item.name)
        for mark in sorted(marks_for(rel, name, fixtures, callspec.id if callspec is not None else "")):
            item.add_marker(getattr(pytest.mark, mark))
