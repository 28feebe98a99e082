"""``celery -A proj durable cosmos check | apply-policy``: the Cosmos container in place (issue 16).

``check`` prints the container's partition key and indexing policy and what the store thinks of
them (without the start-up check, so it works on a container the store refuses). ``apply-policy``
replaces the indexing policy with the recommended one (``docs/azure/indexing-policy.json``) on
the live container: Cosmos re-indexes in the background while reads and writes go on. The
partition key cannot be changed in place; ``check`` says so and points to the migration.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from celery_durable.cli import json_out
from celery_durable.stores.base import find_inner
from celery_durable.stores.cosmos.migrate import ContainerState, apply_indexing_policy, inspect_container
from celery_durable.stores.cosmos.provision import PK_MIGRATION

if TYPE_CHECKING:
    from celery_durable.stores.cosmos.store import CosmosStore

__all__ = ["cosmos"]


def _store(ctx: click.Context) -> CosmosStore:
    from celery_durable.cli.context import durable_of  # noqa: PLC0415 - the app layer, only when a command runs
    from celery_durable.stores.cosmos.store import CosmosStore  # noqa: PLC0415 - the azure SDK is an optional dependency

    # under a traced or counting wrapper: Cosmos, else the innermost store (named below)
    store = find_inner(durable_of(ctx).store, lambda s: isinstance(s, CosmosStore) or getattr(s, "inner", None) is None)
    if not isinstance(store, CosmosStore):
        raise click.ClickException(f"the durable store is not Cosmos DB ({type(store).__name__})")
    return store


def _describe(state: ContainerState) -> None:
    click.echo(f"container       {state.database}/{state.container}")
    click.echo(f"partition key   {state.partition_key} (version {state.partition_key_version})")
    policy = (
        "recommended"
        if state.policy_is_recommended
        else ("indexes every path (writes cost ~2x the RU)" if state.indexes_payloads else "custom")
    )
    click.echo(f"indexing policy {policy}")
    for problem in state.problems:
        click.echo(f"problem         {problem}")
    if not state.problems and not state.indexes_payloads:
        click.echo("ok              the store can use this container as it is")


@click.group(name="cosmos")
def cosmos() -> None:
    """Check or upgrade the Cosmos DB container of the durable store."""


@cosmos.command()
@click.option("--json", "as_json", is_flag=True, help="the container's properties as JSON")
@click.pass_context
def check(ctx: click.Context, as_json: bool) -> None:
    """Show the container's partition key and indexing policy and whether the store accepts them."""
    state = inspect_container(_store(ctx))
    if as_json:
        click.echo(json.dumps(vars(state) | {"policy_is_recommended": state.policy_is_recommended}, default=str))
    else:
        _describe(state)
    if state.problems:
        ctx.exit(1)


@cosmos.command(name="apply-policy")
@click.option("--dry-run", is_flag=True, help="only show what would change")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.option("--json", "as_json", is_flag=True, help="the outcome as JSON (with --yes or --dry-run)")
@click.pass_context
def apply_policy(ctx: click.Context, dry_run: bool, yes: bool, as_json: bool) -> None:
    """Replace the container's indexing policy with the recommended one, in place and online
    (Cosmos re-indexes in the background; the partition key is never changed)."""
    if not dry_run:
        json_out.needs_yes(as_json, yes)
    store = _store(ctx)
    before = inspect_container(store)
    if not as_json:
        _describe(before)
    outcome: dict[str, Any] = {"action": "apply-policy", "dry_run": dry_run, "container": before.container}
    if before.policy_is_recommended:
        _say(as_json, outcome | {"changed": False}, "nothing to do: the indexing policy is the recommended one")
        return
    if dry_run:
        _say(
            as_json,
            outcome | {"changed": False},
            "would replace the indexing policy with docs/azure/indexing-policy.json",
        )
        return
    if not yes:
        click.confirm(f"replace the indexing policy of {before.database}/{before.container}?", abort=True)
    _, after = apply_indexing_policy(store)
    done = "indexing policy replaced: Cosmos re-indexes in the background (see the container's metrics)"
    _say(as_json, outcome | {"changed": True, "problems": list(after.problems)}, done)
    if after.problems:
        for problem in after.problems:
            click.echo(f"still a problem: {problem}", err=True)
        click.echo(f"the partition key needs a new container: {PK_MIGRATION}", err=True)
        ctx.exit(1)


def _say(as_json: bool, data: dict[str, Any], text: str) -> None:
    if as_json:
        json_out.echo(data)
    else:
        click.echo(text)
