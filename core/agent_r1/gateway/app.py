"""The FastAPI routes of a :class:`~agent_r1.gateway.server.PolicyGateway`: each hands its body to a
handler of :mod:`agent_r1.gateway.openai_routes` or :mod:`agent_r1.gateway.episodes`.

Kept apart from the gateway so that FastAPI is imported only when a server is built, and without
postponed annotations: FastAPI reads the handlers' annotations (``Request``) at runtime.

Routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses`` (``POST``; ``GET`` and
``DELETE`` by id) and ``/v1/models``, each also under
``/episodes/{episode_id}``; ``POST /episodes``, ``GET /episodes/{episode_id}``,
``POST /episodes/{episode_id}/reward``, ``POST /episodes/{episode_id}/finish`` and ``GET /health``.
Every error is an OpenAI-style body (``{"error": {"message", "type", "param", "code"}}``).
"""

import json
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agent_r1.gateway import episodes, openai_routes, responses
from agent_r1.gateway.protocol import GatewayHTTPError, RequestError, error_body

__all__ = ["build_app"]


def build_app(gateway: Any) -> FastAPI:
    """The ASGI app serving ``gateway`` (a :class:`~agent_r1.gateway.server.PolicyGateway`)."""
    app = FastAPI(title="agent-r1 policy gateway", docs_url=None, redoc_url=None, openapi_url=None)

    _error_handlers(app)

    async def body_of(request: Request) -> Any:
        raw = await request.body()
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RequestError(f"the request body is not valid JSON: {exc.msg} (char {exc.pos})") from None

    def respond(result: Any) -> Any:
        if isinstance(result, dict):
            return JSONResponse(result)
        return StreamingResponse(result, media_type="text/event-stream")

    def models() -> dict[str, Any]:
        name = gateway.settings.served_model_name
        return {
            "object": "list",
            "data": [{"id": name, "object": "model", "created": 0, "owned_by": "agent-r1"}],
        }

    async def chat(request: Request, episode_id: Optional[str] = None) -> Any:  # noqa: UP045 (runtime-read)
        return respond(await openai_routes.chat(gateway, await body_of(request), episode_id))

    async def completions(request: Request, episode_id: Optional[str] = None) -> Any:  # noqa: UP045
        return respond(await openai_routes.complete(gateway, await body_of(request), episode_id))

    async def create_response(request: Request, episode_id: Optional[str] = None) -> Any:  # noqa: UP045
        return respond(await responses.create(gateway, await body_of(request), episode_id))

    def get_response(response_id: str, episode_id: Optional[str] = None) -> Any:  # noqa: UP045
        return responses.retrieve(gateway, response_id)

    def delete_response(response_id: str, episode_id: Optional[str] = None) -> Any:  # noqa: UP045
        return responses.delete(gateway, response_id)

    for prefix in ("", "/episodes/{episode_id}"):
        app.post(f"{prefix}/v1/chat/completions")(chat)
        app.post(f"{prefix}/v1/completions")(completions)
        app.post(f"{prefix}/v1/responses")(create_response)
        app.get(f"{prefix}/v1/responses/{{response_id}}")(get_response)
        app.delete(f"{prefix}/v1/responses/{{response_id}}")(delete_response)
        app.get(f"{prefix}/v1/models")(models)

    @app.post("/episodes")
    async def open_episode(request: Request) -> Any:
        return episodes.open_episode(gateway, await body_of(request))

    @app.get("/episodes/{episode_id}")
    async def show_episode(episode_id: str) -> Any:
        return episodes.show_episode(gateway, episode_id)

    @app.post("/episodes/{episode_id}/reward")
    async def reward(episode_id: str, request: Request) -> Any:
        return episodes.post_reward(gateway, episode_id, await body_of(request))

    @app.post("/episodes/{episode_id}/finish")
    async def finish(episode_id: str, request: Request) -> Any:
        return episodes.finish_episode(gateway, episode_id, await body_of(request))

    @app.get("/health")
    async def health() -> Any:
        return gateway.health()

    return app


def _error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's format: the gateway's own, unexpected ones, invalid requests and
    unknown routes."""

    @app.exception_handler(GatewayHTTPError)
    async def gateway_error(_: Request, exc: GatewayHTTPError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(Exception)
    async def unexpected_error(_: Request, exc: Exception) -> JSONResponse:
        # A bug (or a library failing in a new way): the client gets an OpenAI-style 500 body and
        # the server's log the traceback (uvicorn prints it after this handler).
        message = f"internal error in the agent-r1 policy gateway: {type(exc).__name__}: {exc}"
        return JSONResponse(error_body(message, kind="server_error"), status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown routes and methods: in OpenAI's error format, not the framework's {"detail": ...}
        if exc.status_code == 404:
            message = (
                f"no route {request.method} {request.url.path} on the agent-r1 policy gateway; it "
                "serves /v1/chat/completions, /v1/completions, /v1/responses and /v1/models (also under "
                "/episodes/<id>)"
            )
            return JSONResponse(error_body(message, code="not_found"), status_code=404)
        return JSONResponse(
            error_body(str(exc.detail), code=str(exc.status_code)), status_code=exc.status_code
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(f"invalid request: {exc.errors()}"), status_code=400)
