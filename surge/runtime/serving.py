"""Compatibility names for the serving runtime, which lives in three files now:
`runtime/request.py` (ServeRequest), `runtime/endpoints.py` (Endpoint, LocalEndpoint,
PipelineEndpoint, RemotePipelineExecutor) and `runtime/server.py` (Server). Import from
those; this module stays only while `runtime/consolidation.py` and `control/` still import
from here (they are other owners' files)."""

from surge.runtime.endpoints import (
    SEQ_IDS_PER_GROUP,
    Endpoint,
    EndpointFailed,
    LocalEndpoint,
    PipelineEndpoint,
    RemotePipelineExecutor,
)
from surge.runtime.request import ServeRequest
from surge.runtime.server import Server

__all__ = [
    "SEQ_IDS_PER_GROUP",
    "Endpoint",
    "EndpointFailed",
    "LocalEndpoint",
    "PipelineEndpoint",
    "RemotePipelineExecutor",
    "ServeRequest",
    "Server",
]
