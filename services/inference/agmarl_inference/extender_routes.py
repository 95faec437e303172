"""The extender's HTTP routes (FastAPI): each verb's body read within the size limit and parsed into
its wire model (413 / 400 otherwise, counted per verb and reason), then handed to ``ExtenderService``;
a failure inside the service answers what kube-scheduler can go on with (the nodes passed through,
neutral scores), never an error status for a well-formed request.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Awaitable, Callable

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from pydantic import BaseModel, ValidationError

from agmarl_inference.extender import ExtenderService
from agmarl_inference.extender_wire import (
    NEUTRAL_SCORE,
    BadRequest,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
    priorities_json,
    request_names,
)

VERBS = ("filter", "prioritize", "bind", "preempt")


def get_extender(request: Request) -> ExtenderService:
    return request.app.state.extender


ExtenderDep = Annotated[ExtenderService, Depends(get_extender)]


def _body(model: type[BaseModel], verb: str) -> Callable[[Request], Awaitable[Any]]:
    """Dependency: the body read within ``max_body_bytes`` (413 past it), parsed (400 when it is not
    JSON or not an ``model`` object); rejects are counted per verb and reason."""
    async def read(request: Request, ext: ExtenderDep) -> Any:
        limit = ext.settings.max_body_bytes

        def reject(status: int, reason: str, detail: str) -> HTTPException:
            ext.metrics.rejected.labels(verb=verb, reason=reason).inc()
            return HTTPException(status, detail)
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise reject(413, "oversized", f"body of {length} bytes exceeds the limit of {limit} bytes")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise reject(413, "oversized", f"body exceeds the limit of {limit} bytes")
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise reject(400, "malformed", f"body is not JSON: {exc}") from None
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
                                 for e in exc.errors()[:5])
            raise reject(400, "schema", f"not a {model.__name__}: {problems}") from None
    return read


FilterArgs = Annotated[ExtenderArgs, Depends(_body(ExtenderArgs, "filter"))]
PrioritizeArgs = Annotated[ExtenderArgs, Depends(_body(ExtenderArgs, "prioritize"))]
BindArgs = Annotated[ExtenderBindingArgs, Depends(_body(ExtenderBindingArgs, "bind"))]
PreemptArgs = Annotated[ExtenderPreemptionArgs, Depends(_body(ExtenderPreemptionArgs, "preempt"))]


def _json(payload: bytes) -> Response:
    return Response(content=payload, media_type="application/json")


def _bad(ext: ExtenderService, verb: str, exc: BadRequest) -> HTTPException:
    ext.metrics.rejected.labels(verb=verb, reason="invalid").inc()
    return HTTPException(400, str(exc))


router = APIRouter()


@router.post("/filter", response_model=ExtenderFilterResult, response_model_exclude_none=True)
async def filter_route(args: FilterArgs, ext: ExtenderDep, request: Request) -> Response:
    try:
        result = await ext.filter(args, request.headers)
    except BadRequest as exc:
        raise _bad(ext, "filter", exc) from None
    except Exception:  # noqa: BLE001 - a bug must not fail scheduling: pass the nodes on
        ext.fallback("error")
        result = ExtenderFilterResult(Nodes=args.Nodes, NodeNames=None if args.Nodes else request_names(args))
    return _json(result.model_dump_json(exclude_none=True).encode())


@router.post("/prioritize", response_model=list[HostPriority])
async def prioritize_route(args: PrioritizeArgs, ext: ExtenderDep, request: Request) -> Response:
    try:
        result = await ext.prioritize(args, request.headers)
    except BadRequest as exc:
        raise _bad(ext, "prioritize", exc) from None
    except Exception:  # noqa: BLE001
        ext.fallback("error")
        result = {n: NEUTRAL_SCORE for n in request_names(args)}
    return _json(priorities_json(result))


@router.post("/bind", response_model=ExtenderBindingResult)
async def bind_route(args: BindArgs, ext: ExtenderDep, request: Request) -> Response:
    try:
        result = await ext.bind(args, request.headers)
    except Exception as exc:  # noqa: BLE001
        result = ExtenderBindingResult(Error=f"binding failed: {type(exc).__name__}")
    return _json(result.model_dump_json().encode())


@router.post("/preempt", response_model=ExtenderPreemptionResult)
async def preempt_route(args: PreemptArgs, ext: ExtenderDep, request: Request) -> Response:
    result = await ext.preempt(args, request.headers)
    return _json(result.model_dump_json().encode())


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(ext: ExtenderDep) -> Response:
    """Ready when NATS is connected and, for nodeCacheCapable requests, the cluster view holds the graph."""
    problems = [p for p, bad in (("nats disconnected", not ext.connected()), ("no cluster graph yet",
                                                                             not ext.cache.warm)) if bad]
    body = {"status": "ready" if not problems else "not ready", "problems": problems,
            "mode": ext.source.mode, "policy": ext.source.policy.name, "graph_version": ext.cache.seq}
    return Response(content=json.dumps(body), media_type="application/json", status_code=503 if problems else 200)
