"""POST /reset_prefix_cache, as vLLM's (its development endpoint): forget every cached prefix block, between benchmark
runs say. {"success": false}, and nothing changed, while a running request's blocks are cached."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from pagedllm.engine.async_engine import AsyncEngine
from pagedllm.errors import InvalidInputError

router = APIRouter()


@router.post("/reset_prefix_cache")
async def reset_prefix_cache(request: Request, reset_running_requests: Annotated[bool, Query()] = False,
                             reset_external: Annotated[bool, Query()] = False) -> JSONResponse:
    """reset_external: there is no external (connector) cache here, so true changes nothing more."""
    if reset_running_requests:
        raise InvalidInputError("reset_running_requests is not supported: running requests are not preempted to "
                                "reset the cache; retry when they are done")
    engine: AsyncEngine = request.app.state.engine
    success = await engine.call(lambda e: e.reset_prefix_cache())
    return JSONResponse({"success": bool(success)})
