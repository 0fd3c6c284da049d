"""The console's Starlette program, and the dispatch that sends /console/ to it on the writer.

The console is a program of its own beside the API (`ConsoleDispatch`, in the writer's
middleware): its errors are pages, not JSON, every answer carries its security headers
(security.PageHeaders), and the API's route table (and so its OpenAPI document) holds only the
API. `/` leads a browser to the console (`ConsoleDispatch`). A gateway has neither the dispatch
nor the program: /console/ is an unknown route there, and a browser is told so in a page
(gateway/console_hint.py).
"""

from __future__ import annotations

import logging

import asyncpg
import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Receive, Scope, Send

from arkvory.shared.errors import ApiError, Busy, NotFound, Unavailable
from arkvory.shared.http.edge import request_id, send_error
from arkvory.shared.http.media_types import accepts_html

from . import (
    account_lifecycle, accounts, audit, catalog, confirm, members, overview, password, publish, retention, session,
    tasks, uploads,
)
from .internal import Refused
from .security import PageHeaders
from .views import FILTERS, GLOBALS

log = logging.getLogger("arkvory.console")

PREFIX = "/console"


async def _home(request: Request) -> Response:
    return RedirectResponse(PREFIX + "/", status_code=308)


def _routes() -> list:
    repo = PREFIX + "/repositories/{repo}"
    artifact = repo + "/artifacts/{artifact_id}"
    get, post = ["GET"], ["POST"]
    return [
        Route(PREFIX + "/", overview.overview_page, methods=get),
        Route(PREFIX + "/overview.json", overview.overview_json, methods=get),
        Route(PREFIX + "/sign-in", session.sign_in_page, methods=get),
        Route(PREFIX + "/sign-in", session.sign_in, methods=post),
        Route(PREFIX + "/sign-out", session.sign_out, methods=post),
        Route(PREFIX + "/repositories", catalog.repositories_page, methods=get),
        Route(PREFIX + "/repositories", catalog.create_repository, methods=post),
        Route(repo, catalog.repository_page, methods=get),
        Route(repo + "/packages", catalog.packages_page, methods=get),
        Route(repo + "/assets", catalog.assets_page, methods=get),
        Route(repo + "/visibility", catalog.set_visibility, methods=post),
        Route(repo + "/delete", catalog.delete_repository, methods=post),
        Route(repo + "/packages/delete", catalog.delete_package, methods=post),
        Route(repo + "/assets/delete", catalog.delete_asset, methods=post),
        Route(repo + "/members", members.members_page, methods=get),
        Route(repo + "/members", members.set_member, methods=post),
        Route(repo + "/members/remove", members.remove_member, methods=post),
        Route(repo + "/permissions", members.permissions_page, methods=get),
        Route(repo + "/upload", uploads.upload_form, methods=post),
        Route(repo + "/retention", retention.retention_page, methods=get),
        Route(repo + "/retention", retention.save_rule, methods=post),
        Route(repo + "/retention/disable", retention.disable_rule, methods=post),
        Route(repo + "/retention/delete", retention.delete_rule, methods=post),
        Route(artifact, catalog.artifact_page, methods=get),
        Route(artifact + "/download", catalog.Download(), methods=["GET", "HEAD"]),
        Route(artifact + "/delete", catalog.delete_artifact, methods=post),
        # Publishing (publish.py), and the confirmation page of every danger (confirm.py): a GET
        # of the danger's own path.
        Route(repo + "/packages/new", publish.publish_package_page, methods=get),
        Route(repo + "/packages", publish.publish_package, methods=post),
        Route(repo + "/package", publish.package_page, methods=get),
        Route(repo + "/assets/new", publish.point_asset_page, methods=get),
        Route(repo + "/assets", publish.point_asset, methods=post),
        Route(repo + "/asset", publish.asset_page, methods=get),
        Route(repo + "/asset/restore", publish.restore_asset, methods=post),
        Route(repo + "/delete", confirm.confirmation_page(confirm.delete_repository), methods=get),
        Route(repo + "/packages/delete", confirm.confirmation_page(confirm.delete_package), methods=get),
        Route(repo + "/assets/delete", confirm.confirmation_page(confirm.delete_asset), methods=get),
        Route(repo + "/members/remove", confirm.confirmation_page(confirm.remove_member), methods=get),
        Route(repo + "/retention/disable", confirm.confirmation_page(confirm.disable_retention), methods=get),
        Route(repo + "/retention/delete", confirm.confirmation_page(confirm.delete_retention), methods=get),
        Route(artifact + "/delete", confirm.confirmation_page(confirm.delete_artifact), methods=get),
        Route(PREFIX + "/accounts/{name}/disable", confirm.confirmation_page(confirm.disable_account), methods=get),
        Route(PREFIX + "/tokens/revoke", confirm.confirmation_page(confirm.revoke_token), methods=get),
        Route(PREFIX + "/tokens/{token_id}/revoke", confirm.confirmation_page(confirm.revoke_token), methods=get),
        Route(PREFIX + "/keys/{key_id}/revoke", confirm.confirmation_page(confirm.revoke_key), methods=get),
        Route(PREFIX + "/tasks", tasks.tasks_page, methods=get),
        Route(PREFIX + "/tasks", tasks.dispatch_task, methods=post),
        Route(PREFIX + "/tasks/{task_id}", tasks.task_page, methods=get),
        Route(PREFIX + "/tasks/{task_id}/cancel", tasks.cancel_task, methods=post),
        Route(PREFIX + "/tasks/{task_id}/cancel", confirm.confirmation_page(confirm.cancel_task), methods=get),
        Route(PREFIX + "/accounts", accounts.accounts_page, methods=get),
        Route(PREFIX + "/accounts", accounts.create_account, methods=post),
        Route(PREFIX + "/accounts/{name}/disable", accounts.disable_account, methods=post),
        Route(PREFIX + "/accounts/{name}/enable", accounts.enable_account, methods=post),
        Route(PREFIX + "/accounts/{name}/password", account_lifecycle.reset_page, methods=get),
        Route(PREFIX + "/accounts/{name}/password", account_lifecycle.reset_password, methods=post),
        Route(PREFIX + "/accounts/{name}/delete", account_lifecycle.delete_page, methods=get),
        Route(PREFIX + "/accounts/{name}/delete", account_lifecycle.delete_account, methods=post),
        Route(PREFIX + "/account/password", password.password_page, methods=get),
        Route(PREFIX + "/account/password", password.change_password, methods=post),
        Route(PREFIX + "/tokens", accounts.tokens_page, methods=get),
        Route(PREFIX + "/tokens", accounts.create_token, methods=post),
        Route(PREFIX + "/tokens/revoke", accounts.revoke_token, methods=post),
        Route(PREFIX + "/tokens/{token_id}/revoke", accounts.revoke_token, methods=post),
        Route(PREFIX + "/keys", accounts.keys_page, methods=get),
        Route(PREFIX + "/keys", accounts.create_key, methods=post),
        Route(PREFIX + "/keys/{key_id}/revoke", accounts.revoke_key, methods=post),
        Route(PREFIX + "/keys/{key_id}/adopt", accounts.adopt_key, methods=post),
        Route(PREFIX + "/audit", audit.audit_page, methods=get),
        Mount(PREFIX + "/static", StaticFiles(packages=[("arkvory.writer.console", "static")]), name="static"),
        Route(PREFIX, _home, methods=get),
    ]


async def _error_page(request: Request, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    try:
        user = await session.signed_in(request)
    except Exception:  # the database may be what failed: the page still answers
        user = None
    response = session.render(
        request, user, "error.html", {"title": _TITLES.get(status, "Refused"), "request_id": request_id(request.scope)},
        status=status, error=message,
    )
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


_TITLES = {400: "Not accepted", 401: "Sign in first", 403: "Not allowed", 404: "Not found", 409: "Conflict",
           413: "Too large", 500: "Something went wrong", 503: "Unavailable"}


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return await _error_page(request, exc.status, f"{exc.message} ({exc.code})", exc.headers())


async def _database_error(request: Request, exc: Exception) -> Response:
    """As the API answers them (shared/http/edge.py): a slow or unreachable database is a 503 to
    retry, never a 500."""
    log.warning("database problem in console request %s: %s: %s", request_id(request.scope), exc.__class__.__name__, exc)
    if isinstance(exc, TimeoutError):
        return await _api_error(request, Busy("the database did not answer in time", retry_after=1))
    return await _api_error(request, Unavailable("the database cannot be reached now"))


_DATABASE_ERRORS = (
    TimeoutError, ConnectionError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
    asyncpg.InsufficientResourcesError, asyncpg.OperatorInterventionError,
)


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refused)
    return await _error_page(request, session.refusal_status(exc), session.refusal_message(exc))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {404: "There is no such console page.", 405: f"{request.method} is not served here."}.get(
        exc.status_code, str(exc.detail)
    )
    return await _error_page(request, exc.status_code, message)


class _UnexpectedErrors:
    """A bug in a console page is logged once, with its traceback, and answered with a page
    (500), not passed on to the writer's own last-resort handler, which would log it again."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking_send(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            if started or scope["type"] != "http":
                raise
            log.exception("unexpected error in console request %s", request_id(scope))
            request = Request(scope, receive)
            response = await _error_page(request, 500, "An internal error happened; the server log has the details.")
            await response(scope, receive, send)


def build_console(writer_app: Starlette) -> Starlette:
    """The console for `writer_app` (whose API it calls in-process)."""
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("arkvory.writer.console", "templates"),
        autoescape=True,  # every value a page shows is escaped, whatever the template
        undefined=jinja2.StrictUndefined,
    )
    # JSON in a page is spelt as the script spells it (JSON.stringify): compact.
    environment.policies["json.dumps_kwargs"] = {"sort_keys": True, "separators": (",", ":")}
    environment.filters.update(FILTERS)
    environment.globals.update(GLOBALS)
    console = Starlette(
        routes=_routes(),
        middleware=[Middleware(PageHeaders), Middleware(_UnexpectedErrors)],
        exception_handlers={
            ApiError: _api_error, Refused: _refused, HTTPException: _http_error,
            **dict.fromkeys(_DATABASE_ERRORS, _database_error),
        },
    )
    console.router.redirect_slashes = False
    console.state.templates = Jinja2Templates(env=environment)
    console.state.writer_app = writer_app
    console.state.runtime = writer_app.state.runtime
    return console


class _NothingAtTheRoot(NotFound):
    def headers(self) -> dict[str, str]:
        return {"Vary": "Accept"}


class ConsoleDispatch:
    """In the writer's middleware: /console and everything under /console/ go to the console
    program (`scope["app"].state.console`, set by `install`), the rest to the API.

    `/` leads a browser (an `Accept` that names text/html) to the console with a redirect; a
    program that GETs it gets the API's JSON 404, saying where the API and the console are, so
    a client that follows redirects never gets a sign-in page for a JSON answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path == PREFIX or path.startswith(PREFIX + "/"):
                writer_app = scope["app"]
                try:
                    await writer_app.state.console(scope, receive, send)
                finally:
                    # The console's Starlette made itself the scope's app; the writer's own
                    # middleware around this one (the audit's refusals) reads the writer's state.
                    scope["app"] = writer_app
                return
            if path == "/" and scope["method"] in ("GET", "HEAD"):
                await _root(scope, send)
                return
        await self.app(scope, receive, send)


async def _root(scope: Scope, send: Send) -> None:
    if not accepts_html(scope["headers"]):
        await send_error(scope, send, _NothingAtTheRoot(
            "nothing is served at /: the API is under /api/v1/ (GET /api/v1/openapi.json describes it),"
            " the web console at /console/"
        ))
        return
    headers = [(b"location", (PREFIX + "/").encode()), (b"vary", b"Accept"), (b"cache-control", b"no-store"),
               (b"content-length", b"0")]
    await send({"type": "http.response.start", "status": 302, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def install(writer_app: Starlette) -> None:
    """Give the writer its console (the writer's middleware holds `ConsoleDispatch`)."""
    writer_app.state.console = build_console(writer_app)
