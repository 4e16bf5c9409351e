"""The ticket pages as a small ASGI app (starlette): sign-in with the actor credential,
then Board, Ticket Detail and Attention over the read models, and the command forms.

Authority stays on the server: the session cookie (HttpOnly, SameSite=Strict, Secure
behind HTTPS) names a session row, the session names the actor, and every command asks
`authority` for the actor's role on the ticket's project while it runs. Controls are
rendered from the same rule, but a posted form is only a request: hidden fields other
than the CSRF token, the expected version, the idempotency key and (to acknowledge a
sweep gap) the newest finding the page showed are never read, and
no role is ever taken from a form. Every POST carries a CSRF token (the session's HMAC,
or a double-submit cookie on the sign-in form); no secret is ever put in a URL.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from urllib.parse import parse_qsl

from psycopg_pool import ConnectionPool
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from nexus_pipelines.actors import sessions
from nexus_pipelines.actors.store import AuthenticationFailed, Principal, memberships
from nexus_pipelines.tickets import board
from nexus_pipelines.tickets.authority import (
    ACKNOWLEDGE,
    PRIORITY,
    TRIAGE,
    CommandRefused,
    NotAuthorized,
    allowed_actions,
)
from nexus_pipelines.tickets.commands import (
    DISPOSITIONS,
    PRIORITIES,
    TRIAGE_STATES,
    VersionConflict,
    acknowledge_sweep_gap,
    set_connector_ticket_priority,
    triage_connector_ticket,
)
from nexus_pipelines.tickets.board import FINDING_MEANING, resolved_by
from nexus_pipelines.tickets.intake import SWEEP_GAP_FINDING
from nexus_pipelines.tickets.queries import ticket_detail
from nexus_pipelines.tickets.web.outage import UNREACHABLE, ControlPlaneDown, OutageWatch, unreachable_answer
from nexus_pipelines.tickets.web.templates import CSS, environment

SESSION_COOKIE = "np_session"
SIGNIN_COOKIE = "np_signin"
MAX_FORM_BYTES = 16_384
NOTICES = {"priority": "Priority recorded.", "triage": "Triage recorded.", "acknowledge": "Sweep gap acknowledged.",
           "replayed": "That decision was recorded before; nothing new was written.",
           "unchanged": "The ticket already has that priority; nothing was recorded."}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; form-action 'self'; frame-ancestors 'none'; "
                               "base-uri 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store",
}


class _Pages:
    def __init__(self, pool: ConnectionPool, *, secure_cookies: bool) -> None:
        self.pool, self.secure = pool, secure_cookies
        self.templates = environment()
        self.outage = OutageWatch()

    # -- plumbing -----------------------------------------------------------------------

    async def db(self, work: Callable, *args):
        def run():
            try:
                with self.pool.connection(timeout=self.outage.connect_wait_s()) as conn:
                    result = work(conn, *args)
            except UNREACHABLE as exc:
                raise self.outage.failed(exc) from None
            self.outage.reached()
            return result
        return await run_in_threadpool(run)

    def html(self, name: str, status: int = 200, **context) -> HTMLResponse:
        context.setdefault("principal", None)
        context.setdefault("counts", [])
        context.setdefault("notice", None)
        context.setdefault("error", None)
        return HTMLResponse(self.templates.get_template(name).render(**context), status_code=status,
                            headers=HEADERS)

    def cookie(self, response: Response, name: str, value: str, max_age: int | None) -> None:
        response.set_cookie(name, value, max_age=max_age, httponly=True, samesite="strict", secure=self.secure,
                            path="/")

    @staticmethod
    async def form(request: Request) -> dict[str, str] | None:
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
            return None
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            return None
        try:
            return dict(parse_qsl(body.decode(), keep_blank_values=True, max_num_fields=20))
        except (UnicodeDecodeError, ValueError):
            return None

    async def session(self, request: Request) -> tuple[str, Principal] | None:
        token = request.cookies.get(SESSION_COOKIE)
        principal = await self.db(sessions.resolve, token) if token else None
        return (token, principal) if principal else None

    @staticmethod
    def _frame(conn, principal: Principal) -> dict:
        scope = memberships(conn, principal)
        return {"principal": principal, "scope": scope, "counts": board.project_counts(conn, scope)}

    # -- sign-in ------------------------------------------------------------------------

    async def signin_page(self, request: Request, error: str | None = None, status: int = 200) -> Response:
        token = secrets.token_urlsafe(24)
        response = self.html("signin", status, csrf=token, error=error)
        self.cookie(response, SIGNIN_COOKIE, token, 600)
        return response

    async def signin(self, request: Request) -> Response:
        form = await self.form(request)
        expected = request.cookies.get(SIGNIN_COOKIE)
        if form is None or not expected or not secrets.compare_digest(expected, form.get("csrf", "")):
            return await self.signin_page(request, "The sign-in form expired or came from elsewhere; try again.", 403)
        try:
            token, _ = await self.db(sessions.start, form.get("credential", ""))
        except AuthenticationFailed as exc:
            return await self.signin_page(request, str(exc).capitalize() + ".", 401)
        response = RedirectResponse("/board", status_code=303)
        self.cookie(response, SESSION_COOKIE, token, int(sessions.SESSION_TTL.total_seconds()))
        response.delete_cookie(SIGNIN_COOKIE, path="/")
        return response

    async def signout(self, request: Request) -> Response:
        found, form = await self.session(request), await self.form(request)
        if found:
            if form is None or not sessions.csrf_ok(found[0], form.get("csrf")):
                return _forged_form()
            await self.db(sessions.end, found[0])
        response = RedirectResponse("/signin", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    # -- pages --------------------------------------------------------------------------

    async def board_page(self, request: Request) -> Response:
        found = await self.session(request)
        if not found:
            return RedirectResponse("/signin", status_code=303)
        triage = request.query_params.get("triage")
        triage = triage if triage in TRIAGE_STATES else None

        def read(conn):
            frame = self._frame(conn, found[1])
            return {**frame, "lanes": board.board_lanes(conn, frame["scope"], triage=triage)}

        return self.html("board", page="board", csrf=sessions.csrf_token(found[0]), triage=triage,
                         triage_states=TRIAGE_STATES, **await self.db(read))

    async def attention_page(self, request: Request) -> Response:
        found = await self.session(request)
        if not found:
            return RedirectResponse("/signin", status_code=303)

        def read(conn):
            frame = self._frame(conn, found[1])
            return {**frame, "findings": board.attention_items(conn, frame["scope"])}

        return self.html("attention", page="attention", csrf=sessions.csrf_token(found[0]), **await self.db(read))

    def _detail(self, conn, principal: Principal, ticket_id: int) -> dict | None:
        frame = self._frame(conn, principal)
        ticket = ticket_detail(conn, ticket_id)
        if ticket is None or ticket["external_ref"] is None or not any(
                (m.tenant, m.project) == (ticket["tenant"], ticket["project"]) for m in frame["scope"]):
            return None  # another project's ticket reads as absent
        actions = allowed_actions(conn, principal, ticket["tenant"], ticket["project"])
        if ticket["status"] != "open":
            actions &= {ACKNOWLEDGE}  # a gap can be found on a closed ticket too
        if ticket["triage_state"] != "UNTRIAGED":
            actions -= {TRIAGE}
        gaps = [f["finding_id"] for f in ticket["findings"] if f["kind"] == SWEEP_GAP_FINDING and not f["disposition"]]
        link = ticket["display_url"] if ticket["display_url"].startswith(("https://", "http://")) else None
        automatic = all(f["actor_role"] is None for f in ticket["priority_facts"])
        return {**frame, "t": ticket, "controls": actions, "link": link, "automatic": automatic,
                "waiting_gap": max(gaps) if gaps and ACKNOWLEDGE in actions else None,
                "meaning": FINDING_MEANING, "resolved_by": resolved_by}

    async def detail_page(self, request: Request, *, error: str | None = None, status: int = 200) -> Response:
        found = await self.session(request)
        if not found:
            return RedirectResponse("/signin", status_code=303)
        context = await self.db(self._detail, found[1], request.path_params["ticket_id"])
        if context is None:
            return self.html("not_found", 404, page=None, csrf=sessions.csrf_token(found[0]),
                             error="No such ticket in your projects.",
                             **await self.db(self._frame, found[1]))
        notice = NOTICES.get(request.query_params.get("done", "")) if not error else None
        return self.html("detail", status, page=None, csrf=sessions.csrf_token(found[0]), error=error, notice=notice,
                         command_id=str(uuid.uuid4()), priorities=PRIORITIES, dispositions=DISPOSITIONS, **context)

    # -- commands -----------------------------------------------------------------------

    async def command(self, request: Request) -> Response:
        found = await self.session(request)
        if not found:
            return PlainTextResponse("sign in first", status_code=401, headers=HEADERS)
        form = await self.form(request)
        if form is None or not sessions.csrf_ok(found[0], form.get("csrf")):
            return _forged_form()
        ticket_id, action = request.path_params["ticket_id"], request.path_params["action"]
        if action not in _COMMANDS:
            return PlainTextResponse("no such command", status_code=404, headers=HEADERS)
        try:
            result = await self.db(_COMMANDS[action], found[1], ticket_id, form)
        except VersionConflict as exc:
            return await self.detail_page(request, error=str(exc), status=409)
        except NotAuthorized as exc:
            return await self.detail_page(request, error=f"Refused: {exc}", status=403)
        except CommandRefused as exc:
            return await self.detail_page(request, error=str(exc), status=422)
        done = "replayed" if result.replayed else "unchanged" if result.unchanged else action
        return RedirectResponse(f"/tickets/{ticket_id}?done={done}", status_code=303)


def _forged_form() -> Response:
    return PlainTextResponse("refused: the form expired or came from elsewhere; reload the page", status_code=403,
                             headers=HEADERS)


def _number(value: str | None, name: str) -> int:
    if not value or not value.strip().isdigit():
        raise CommandRefused(f"{name} must be a number")
    return int(value)


def _priority(conn, principal: Principal, ticket_id: int, form: dict[str, str]):
    return set_connector_ticket_priority(
        conn, principal, client_command_id=form.get("client_command_id", ""), ticket_id=ticket_id,
        expected_version=_number(form.get("expected_version"), "expected_version"),
        priority=form.get("priority", ""), reason=form.get("reason", ""))


def _triage(conn, principal: Principal, ticket_id: int, form: dict[str, str]):
    canonical = form.get("canonical_ticket_id", "").strip()
    return triage_connector_ticket(
        conn, principal, client_command_id=form.get("client_command_id", ""), ticket_id=ticket_id,
        expected_version=_number(form.get("expected_version"), "expected_version"),
        disposition=form.get("disposition", ""),
        canonical_ticket_id=_number(canonical, "the canonical ticket") if canonical else None,
        reason=form.get("reason", ""))


def _acknowledge(conn, principal: Principal, ticket_id: int, form: dict[str, str]):
    return acknowledge_sweep_gap(
        conn, principal, client_command_id=form.get("client_command_id", ""), ticket_id=ticket_id,
        expected_version=_number(form.get("expected_version"), "expected_version"),
        through_finding_id=_number(form.get("through_finding_id"), "through_finding_id"),
        reason=form.get("reason", ""))


_COMMANDS = {PRIORITY: _priority, TRIAGE: _triage, ACKNOWLEDGE: _acknowledge}


def build_app(pool: ConnectionPool, *, secure_cookies: bool = False) -> Starlette:
    pages = _Pages(pool, secure_cookies=secure_cookies)

    async def css(request: Request) -> Response:
        return Response(CSS, media_type="text/css", headers={"Cache-Control": "max-age=300"})

    async def home(request: Request) -> Response:
        return RedirectResponse("/board", status_code=303)

    return Starlette(exception_handlers={ControlPlaneDown: unreachable_answer(HEADERS)}, routes=[
        Route("/", home),
        Route("/static/app.css", css),
        Route("/signin", pages.signin_page, methods=["GET"]),
        Route("/signin", pages.signin, methods=["POST"]),
        Route("/signout", pages.signout, methods=["POST"]),
        Route("/board", pages.board_page),
        Route("/attention", pages.attention_page),
        Route("/tickets/{ticket_id:int}", pages.detail_page),
        Route("/tickets/{ticket_id:int}/{action:str}", pages.command, methods=["POST"]),
    ])
