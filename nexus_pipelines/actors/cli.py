"""`nexus-pipelines actors ...`: add actors (their credential is printed once), grant and
revoke project roles, reissue a credential, list.

Administering actors takes the control-plane database itself (NEXUS_PG_DSN): it is the
bootstrap authority, like applying migrations. Every ticket decision afterwards is made
by an actor authenticated with its own credential.
"""

from __future__ import annotations

import click

from nexus_pipelines.cli_common import UserError, control_connection, operator


def _admin(action, *args, **kwargs):
    from nexus_pipelines.actors.store import ActorError

    with control_connection() as conn:
        try:
            return action(conn, *args, **kwargs)
        except ActorError as exc:
            raise UserError(str(exc)) from None


def _show_once(actor_id: str, credential: str) -> None:
    click.echo(f"credential of {actor_id} (shown once, only its hash is stored; hand it over privately):")
    click.echo(credential)
    click.echo("use it: sign in to the ticket pages, or export NEXUS_ACTOR_CREDENTIAL for `tickets triage|priority` "
               "(a prompt asks when it is unset)")


@click.group("actors")
def actors() -> None:
    """Actors who triage and prioritize connector tickets, and their project roles."""


@actors.command("add")
@click.argument("actor_id")
@click.option("--name", "display_name", required=True, help="The person's or service's display name.")
@click.option("--project", default=None, help="Grant a role on this project (tenant/project) right away.")
@click.option("--role", type=click.Choice(["commander", "operator"]), default=None)
def add_cmd(actor_id: str, display_name: str, project: str | None, role: str | None) -> None:
    """Create an actor and print its credential once."""
    from nexus_pipelines.actors.store import add_actor, grant

    if (project is None) != (role is None):
        raise UserError("--project and --role go together")

    def add(conn) -> str:
        with conn.transaction():  # a refused grant issues no credential
            credential = add_actor(conn, actor_id, display_name=display_name, created_by=operator())
            if project:
                grant(conn, actor_id, project, role, granted_by=operator())
            return credential

    credential = _admin(add)
    if project:
        click.echo(f"{actor_id} is {role} of {project}")
    _show_once(actor_id, credential)


@actors.command("grant")
@click.argument("actor_id")
@click.option("--project", required=True, help="tenant/project, as a registration names it.")
@click.option("--role", type=click.Choice(["commander", "operator"]), required=True)
def grant_cmd(actor_id: str, project: str, role: str) -> None:
    """Give an actor a role on a project (replaces its other role there)."""
    from nexus_pipelines.actors.store import grant

    outcome = _admin(grant, actor_id, project, role, granted_by=operator())
    click.echo(f"{actor_id} is {role} of {project}" + (" (unchanged)" if outcome == "unchanged" else ""))


@actors.command("revoke")
@click.argument("actor_id")
@click.option("--project", required=True)
def revoke_cmd(actor_id: str, project: str) -> None:
    """Take an actor's role on a project away."""
    from nexus_pipelines.actors.store import revoke

    done = _admin(revoke, actor_id, project, revoked_by=operator())
    click.echo(f"{actor_id} {'has no role on' if done else 'had no role on'} {project}" + (" now" if done else ""))


@actors.command("reissue")
@click.argument("actor_id")
def reissue_cmd(actor_id: str) -> None:
    """Revoke an actor's credential (its page sessions end) and print a new one once."""
    from nexus_pipelines.actors.store import reissue

    _show_once(actor_id, _admin(reissue, actor_id, issued_by=operator()))


@actors.command("list")
def list_cmd() -> None:
    """Actors, whether they hold a live credential, and their roles."""
    from nexus_pipelines.actors.store import list_actors

    rows = _admin(list_actors)
    if not rows:
        click.echo("no actors: add one with `nexus-pipelines actors add`")
    for row in rows:
        issued = f"credential issued {row.credential_issued_at:%Y-%m-%d}" if row.credential_issued_at else \
            "no live credential"
        click.echo(f"{row.actor_id}\t{row.display_name}\t{issued}\t{', '.join(row.memberships) or 'no roles'}")
