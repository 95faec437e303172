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
