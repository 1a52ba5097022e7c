"""Read-only endpoints: models, health (and /ping), version, Prometheus metrics, the KV pool snapshot, the dashboard."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse, JSONResponse

from pagedllm import __version__
from pagedllm.engine.async_engine import AsyncEngine
from pagedllm.entrypoints.server.errors import model_not_found
from pagedllm.metrics import CONTENT_TYPE

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
router = APIRouter()


def read_only(path: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A GET route that answers HEAD too (the server sends the headers alone; only GET is in the API schema)."""
    def register(endpoint: Callable[..., Any]) -> Callable[..., Any]:
        router.add_api_route(path, endpoint, methods=["HEAD"], include_in_schema=False)
        return router.get(path)(endpoint)

    return register


def _model_card(engine: AsyncEngine, created: int) -> dict[str, Any]:
    return {"id": engine.model_name, "object": "model", "created": created, "owned_by": "pagedllm",
            "root": engine.config.model or engine.model_name, "max_model_len": engine.max_model_len}


@read_only("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    card = _model_card(request.app.state.engine, request.app.state.started)
    return {"object": "list", "data": [card]}


@read_only("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    engine: AsyncEngine = request.app.state.engine
    if model_id != engine.model_name:
        raise model_not_found(model_id)
    return _model_card(engine, request.app.state.started)


@read_only("/health")
async def health(request: Request) -> JSONResponse:
    ok = request.app.state.engine.running
    return JSONResponse({"status": "ok" if ok else "engine stopped"}, status_code=200 if ok else 503)


@router.post("/ping")
@read_only("/ping")
async def ping(request: Request) -> JSONResponse:
    """vLLM's (SageMaker's) health check, GET or POST: /health's answer."""
    return await health(request)


@read_only("/version")
async def version() -> dict[str, str]:
    return {"version": __version__}


@read_only("/metrics")
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)


@read_only("/v1/kv")
async def kv_snapshot(request: Request, offset: Annotated[int, Query(ge=0)] = 0,
                      limit: Annotated[int | None, Query(ge=1)] = None) -> dict[str, Any]:
    """Blocks [offset, offset + limit) of the pool (every block by default), and the whole pool's counts."""
    engine: AsyncEngine = request.app.state.engine
    snapshot = await engine.kv_snapshot(offset, limit)
    return {**snapshot, "model": engine.model_name}


@read_only("/dashboard")
async def dashboard() -> FileResponse:
    return FileResponse(STATIC_DIR / "dashboard.html", media_type="text/html")


@read_only("/dashboard.js")
async def dashboard_js() -> FileResponse:
    return FileResponse(STATIC_DIR / "dashboard.js", media_type="text/javascript")
