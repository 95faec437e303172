"""Integration fixtures: the six services as real processes on the session's real nats-server."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

SERVICES = ("state-collector", "graph-builder", "inference", "reward-calculator", "adaptive-engine", "trainer")


def module_of(service: str) -> str:
    return "agmarl_" + service.replace("-", "_")


def scrape(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0).text


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        m = re.match(r"^(\w+)(\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(4))
    return total


async def wait_for(predicate, timeout: float, interval: float = 0.1):
    """Poll an async or sync predicate until truthy (bounded); returns its last value."""
    deadline = asyncio.get_running_loop().time() + timeout
    value = None
    while asyncio.get_running_loop().time() < deadline:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(interval)
    return value


@pytest.fixture
def trace_dir(tmp_path):
    d = tmp_path / "traces"
    d.mkdir()
    return d
