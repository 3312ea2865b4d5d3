"""Admin routes: deployments, nodes, health and Prometheus metrics.

What flows: JSON bodies to the controller's facade (`create`, `delete`, `describe`,
`nodes_view`); its `SurgeError`s (`Conflict`, `NotFound`, ...) become statuses in
`api/app.py` by type. Owned by the API layer.
"""

from typing import Any

import pydantic_core
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from surge.control.controller import Controller
from surge.errors import InvalidInput


async def json_object(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:  # pydantic's parser, as for the OpenAI routes: no lone surrogates, bounded depth
        body = pydantic_core.from_json(raw)
    except ValueError as e:
        raise InvalidInput(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise InvalidInput("the request body must be a JSON object")
    return body


def admin_router(controller: Controller) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/deployments")
    async def list_deployments():
        return {"data": controller.describe_all()}

    @router.post("/v1/deployments", status_code=201)
    async def create_deployment(request: Request):
        dep = await controller.create(await json_object(request))
        return JSONResponse(controller.describe(dep), status_code=201)

    @router.get("/v1/deployments/{name}")
    async def get_deployment(name: str):
        return controller.describe_named(name)

    @router.delete("/v1/deployments/{name}")
    async def delete_deployment(name: str):
        await controller.delete(name)
        return {"deleted": name}

    @router.get("/v1/nodes")
    async def nodes():
        return {"data": controller.nodes_view(), "parameter_pool": controller.pool.view()}

    @router.get("/health")
    async def health():
        live, total = len(controller.live_nodes()), len(controller.nodes)
        # degraded while any node is missing (down, being replaced, or given up on)
        return {"status": "ok" if live == total else "degraded", "nodes_up": live,
                "nodes": total}  # fmt: skip

    @router.get("/metrics")
    async def metrics():
        await controller.refresh_metrics()
        return Response(controller.metrics.render(), media_type="text/plain; version=0.0.4")

    return router
