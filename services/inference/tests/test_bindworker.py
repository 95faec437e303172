"""The bind worker process (agmarl_inference.bindworker) against the STAND-IN API server: answers mapped
back to the Binding that asked, a request without an answer, loading the client from a kubeconfig, a child
that cannot start, and a child that ends with its parent."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import textwrap
import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agmarl_inference.bindworker import BindWorker, Hello, WorkerGone
from agmarl_testing.k8s_api import StandInApiServer, node_json, pod_json

LOG = logging.getLogger("test-bindworker")


@pytest.fixture
def standin():
    with StandInApiServer() as s:
        s.add_node(node_json("a"))
        for name in ("p1", "p2", "p3", "slow"):
            s.add_pod(pod_json(name))
        yield s


async def test_each_binding_gets_its_own_answer(standin):
    worker = BindWorker(Hello(client.Configuration(host=standin.url), threads=4, timeout=5.0), LOG)
    await worker.start()
    try:
        answers = await asyncio.gather(worker.bind("default", "p1", "a"), worker.bind("default", "nope", "a"),
                                       worker.bind("default", "p2", "a"), worker.bind("default", "p3", "zz"),
                                       return_exceptions=True)
        assert answers[0] is None and answers[2] is None
        assert isinstance(answers[1], ApiException) and answers[1].status == 404
        assert isinstance(answers[3], ApiException) and answers[3].status == 404
        with pytest.raises(ApiException) as conflict:
            await worker.bind("default", "p1", "a")  # already bound
        assert conflict.value.status == 409 and conflict.value.reason == "Conflict"
        assert sorted(standin.bindings) == [("default/p1", "a"), ("default/p2", "a")]
    finally:
        await worker.close(5.0)
    assert worker.proc.returncode == 0


async def test_a_binding_without_an_answer_is_a_connection_error(standin):
    worker = BindWorker(Hello(client.Configuration(host=standin.url), threads=2, timeout=0.3), LOG)
    await worker.start()
    standin.hold_bindings(1)
    try:
        with pytest.raises(ConnectionError) as exc:
            await worker.bind("default", "slow", "a")
        assert not isinstance(exc.value, WorkerGone) and "Timeout" in str(exc.value)
    finally:
        standin.release_bindings()
        await worker.close(5.0)


async def test_the_worker_loads_its_client_from_a_kubeconfig(standin, tmp_path):
    path = standin.write_kubeconfig(tmp_path / "kubeconfig")
    worker = BindWorker(Hello(kubeconfig=str(path), context="standin"), LOG)
    await worker.start()
    try:
        await worker.bind("default", "p1", "a")
    finally:
        await worker.close(5.0)
    assert standin.bindings == [("default/p1", "a")]


async def test_a_worker_that_cannot_start_raises(tmp_path):
    worker = BindWorker(Hello(kubeconfig=str(tmp_path / "missing")), LOG)
    with pytest.raises(WorkerGone, match="did not start"):
        await worker.start()
    assert worker.proc.returncode not in (None, 0)


PARENT = textwrap.dedent("""
    import asyncio, logging, sys
    from kubernetes import client
    from agmarl_inference.bindworker import BindWorker, Hello

    async def main():
        worker = BindWorker(Hello(client.Configuration(host="http://127.0.0.1:9")), logging.getLogger("p"))
        await worker.start()
        print(worker.proc.pid, flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
""")


def test_the_worker_ends_with_its_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        os.kill(child, 0)  # running
        parent.kill()  # no clean-up in the parent: SIGKILL
        parent.wait(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and alive(child):
            time.sleep(0.05)
        assert not alive(child)
    finally:
        if parent.poll() is None:
            parent.kill()


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
