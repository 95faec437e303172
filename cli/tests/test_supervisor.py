"""The supervisor's restart policy: exponential backoff, bounded, starting over after a stable run."""
import pytest

from agmarl_cli.supervisor import RESTART_CAP_S, STABLE_AFTER_S, Supervised, restart_delay


@pytest.mark.parametrize("failures, delay", [(1, 0.5), (2, 1.0), (3, 2.0), (7, 30.0), (50, RESTART_CAP_S)])
def test_restart_delay_doubles_up_to_the_cap(failures, delay):
    assert restart_delay(failures) == delay


def test_quick_exits_back_off_and_a_stable_run_starts_over():
    sup = Supervised(started_at=0.0)
    assert sup.exited(-9, now=1.0) == 0.5 and sup.due == 1.5
    assert sup.restarted(now=1.5) == 1
    assert sup.exited(1, now=2.0) == 1.0  # quick again: doubled
    sup.exited(None, now=3.0)  # a failed start: counted as a failure, not an exit
    assert sup.report() == {"restarts": 1, "exits": ["exited -9", "exited 1"], "running": False}
    sup.restarted(now=5.0)
    assert sup.exited(-15, now=5.0 + STABLE_AFTER_S) == 0.5  # up long enough: back to the first delay


def test_a_restart_whose_metrics_port_was_taken_gets_a_new_one(tmp_path):
    """A service's metrics port is chosen before it starts and can be taken meanwhile (a CI run: the
    adaptive-engine died at start, "Address already in use", and was never healthy): its restart gets a free
    port, which run.json and the endpoints line show. A port still free is kept."""
    import json
    import socket
    import subprocess
    import sys

    from agmarl_cli.supervisor import System
    from agmarl_common.runtime.natsserver import port_free

    system = System(root=tmp_path, run_id="t")
    system.log_dir.mkdir(parents=True)
    taker = socket.socket()
    taker.bind(("127.0.0.1", 0))
    taker.listen()
    try:
        taken = taker.getsockname()[1]
        assert not port_free(taken)
        kept = system.metrics_ports["trainer"]
        system.metrics_ports["adaptive-engine"] = taken
        for name in ("adaptive-engine", "trainer"):  # both died at once
            system.procs[name] = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
            system.procs[name].wait(30)
        system.supervise(now=0.0)  # records the exits
        started = []
        try:
            system.supervise(now=100.0)  # past the backoff: restarts both
            started = [system.procs[name] for name in ("adaptive-engine", "trainer")]
        finally:
            for proc in started:
                proc.kill()
                proc.wait(30)
        new = system.metrics_ports["adaptive-engine"]
        assert new != taken and port_free(new) and system.metrics_ports["trainer"] == kept
        assert json.loads((tmp_path / "run.json").read_text())["metrics_urls"]["adaptive-engine"].endswith(f":{new}/metrics")
    finally:
        taker.close()
    assert port_free(taken)
