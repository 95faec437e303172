"""The extender's HTTP routes (FastAPI): each verb's body read within ``max_body_bytes`` (413 from
Content-Length or the bytes streamed, before any parsing) and parsed by ``extender_wire.parse_args``
(400 not JSON as Go writes it, 413 more than ``extender_max_nodes`` nodes, 422 not the verb's schema or
a pod we cannot read; each counted per verb and reason), then handed to ``ExtenderService``; a
failure inside the service answers what kube-scheduler can go on with (the nodes passed through,
neutral scores), never an error status for a well-formed request, and never 500.

Time: the budget runs from the request's arrival, so reading and parsing count in it. A body over
``INLINE_BYTES`` is parsed, and a large answer written, on a thread, not on the event loop the NATS
decision loop shares; a prioritize whose parse outlasts the budget answers no scores at once (``[]``,
which kube-scheduler adds up as it does all-neutral scores; fallback ``parse_timeout``). A filter has
to name the nodes that pass, so it waits for its parse and, the budget spent, passes every node on.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated, Any, Awaitable, Callable

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from agmarl_inference.extender import ExtenderService
from agmarl_inference.extender_wire import (
    BadRequest,
    BodyError,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
    Priorities,
    parse_args,
    priorities_json,
    request_names,
)

VERBS = ("filter", "prioritize", "bind", "preempt")
INLINE_BYTES = 64 * 1024  # bodies up to this are parsed on the event loop (well under a millisecond)
INLINE_NODES = 2_000  # answers naming more nodes than this are written on a thread


async def get_extender(request: Request) -> ExtenderService:  # async: a plain def would run on a worker thread
    return request.app.state.extender


ExtenderDep = Annotated[ExtenderService, Depends(get_extender)]


async def arrival(request: Request) -> float:
    """``time.perf_counter()`` when the verb's dependencies started: the start of its time budget."""
    if not hasattr(request.state, "arrived"):
        request.state.arrived = time.perf_counter()
    return request.state.arrived


Arrival = Annotated[float, Depends(arrival)]


def _discard(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()  # retrieved: a parse nobody waits for any more must not warn


def _body(model: type[BaseModel], verb: str, late: bool = False) -> Callable[..., Awaitable[Any]]:
    """Dependency: the body read within ``max_body_bytes`` and parsed into ``model`` (``parse_args``);
    rejects raise HTTPException, counted per verb and reason. ``late``: when a parse outlasts the time
    budget, None at once instead of the model (the parse finishes on its thread, unread)."""
    async def read(request: Request, ext: ExtenderDep, started: Arrival) -> Any:
        limit = ext.settings.max_body_bytes

        def reject(status: int, reason: str, detail: str) -> HTTPException:
            ext.metrics.rejected.labels(verb=verb, reason=reason).inc()
            return HTTPException(status, detail)
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise reject(413, "oversized", f"body of {length} bytes exceeds the limit of {limit} bytes")
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise reject(413, "oversized", f"body exceeds the limit of {limit} bytes")
        except ClientDisconnect:
            raise reject(400, "disconnected", "the client went away before the body was read") from None
        try:
            if len(body) <= INLINE_BYTES:
                return parse_args(model, bytes(body), ext.settings.extender_max_nodes)
            parsing = ext.offload(parse_args, model, bytes(body), ext.settings.extender_max_nodes)
            if not late:
                return await parsing
            try:
                left = started + ext.work_budget - time.perf_counter()
                return await asyncio.wait_for(asyncio.shield(parsing), max(left, 0.0))
            except asyncio.TimeoutError:
                parsing.add_done_callback(_discard)
                ext.fallback("parse_timeout")
                return None
        except BodyError as exc:
            raise reject(exc.status, exc.reason, exc.detail) from None
    return read


FilterArgs = Annotated[ExtenderArgs, Depends(_body(ExtenderArgs, "filter"))]
PrioritizeArgs = Annotated[ExtenderArgs | None, Depends(_body(ExtenderArgs, "prioritize", late=True))]
BindArgs = Annotated[ExtenderBindingArgs, Depends(_body(ExtenderBindingArgs, "bind"))]
PreemptArgs = Annotated[ExtenderPreemptionArgs, Depends(_body(ExtenderPreemptionArgs, "preempt"))]


async def _json(ext: ExtenderService, write: Callable[[], bytes], nodes: int = 0) -> Response:
    """The answer ``write()`` makes; on a thread when it names more than ``INLINE_NODES`` nodes."""
    payload = await ext.offload(write) if nodes > INLINE_NODES else write()
    return Response(content=payload, media_type="application/json")


def _bad(ext: ExtenderService, verb: str, exc: BadRequest) -> HTTPException:
    ext.metrics.rejected.labels(verb=verb, reason="invalid").inc()
    detail = str(exc)
    return HTTPException(422, detail if len(detail) <= 500 else detail[:500] + "...")


router = APIRouter()


@router.post("/filter", response_model=ExtenderFilterResult, response_model_exclude_none=True)
async def filter_route(args: FilterArgs, ext: ExtenderDep, request: Request, started: Arrival) -> Response:
    try:
        result = await ext.filter(args, request.headers, started)
    except BadRequest as exc:
        raise _bad(ext, "filter", exc) from None
    except Exception:  # noqa: BLE001 - a bug must not fail scheduling: pass the nodes on
        ext.fallback("error")
        result = ExtenderFilterResult(Nodes=args.Nodes, NodeNames=None if args.Nodes else request_names(args))
    nodes = len(result.Nodes.items) if result.Nodes is not None else len(result.NodeNames or ())
    return await _json(ext, lambda: result.model_dump_json(exclude_none=True).encode(), nodes)


@router.post("/prioritize", response_model=list[HostPriority])
async def prioritize_route(args: PrioritizeArgs, ext: ExtenderDep, request: Request, started: Arrival
                           ) -> Response:
    if args is None:  # the parse outlasted the budget: no scores, now
        return Response(content=b"[]", media_type="application/json")
    try:
        result = await ext.prioritize(args, request.headers, started)
    except BadRequest as exc:
        raise _bad(ext, "prioritize", exc) from None
    except Exception:  # noqa: BLE001
        ext.fallback("error")
        result = Priorities.neutral(request_names(args))
    return await _json(ext, lambda: priorities_json(result), len(result.hosts))


@router.post("/bind", response_model=ExtenderBindingResult)
async def bind_route(args: BindArgs, ext: ExtenderDep, request: Request) -> Response:
    try:
        result = await ext.bind(args, request.headers)
    except Exception as exc:  # noqa: BLE001
        result = ExtenderBindingResult(Error=f"binding failed: {type(exc).__name__}")
    return await _json(ext, lambda: result.model_dump_json().encode())


@router.post("/preempt", response_model=ExtenderPreemptionResult)
async def preempt_route(args: PreemptArgs, ext: ExtenderDep, request: Request) -> Response:
    result = await ext.preempt(args, request.headers)
    return await _json(ext, lambda: result.model_dump_json().encode(), len(result.NodeNameToMetaVictims))


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/debug/view")
async def view_route(ext: ExtenderDep) -> Response:
    """The extender's cluster view in brief: its version, the assumed pods and the pods per node
    (observed + assumed), for ``agmarl bench extender``'s spread report."""
    view, state = ext.cache, ext.cache.state
    per_node = {} if state is None else {n.name: len(pods) for n, pods in zip(state.nodes, state.bound)}
    body = {"version": view.seq, "assumed": len(view.assumed), "held_decisions": len(ext.pending),
            "pods_per_node": per_node}
    return Response(content=json.dumps(body), media_type="application/json")


@router.get("/readyz")
async def readyz(ext: ExtenderDep) -> Response:
    """Ready when NATS is connected and, for nodeCacheCapable requests, the cluster view holds the graph."""
    problems = [p for p, bad in (("nats disconnected", not ext.connected()), ("no cluster graph yet",
                                                                             not ext.cache.warm)) if bad]
    body = {"status": "ready" if not problems else "not ready", "problems": problems,
            "mode": ext.source.mode, "policy": ext.source.policy.name, "graph_version": ext.cache.seq}
    return Response(content=json.dumps(body), media_type="application/json", status_code=503 if problems else 200)
