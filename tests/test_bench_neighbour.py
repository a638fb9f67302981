"""The benchmark neighbour: started in the asked mode and always stopped."""
import os
import time

import pytest

from bench.neighbour import neighbour


@pytest.mark.parametrize("mode, nice, own_session", [("nice19", 19, False), ("nice0", 0, False),
                                                     ("nice19-session", 19, True)])
def test_neighbour_runs_busy_in_its_mode_and_is_stopped(mode, nice, own_session):
    with neighbour(mode) as process:
        assert process.poll() is None
        deadline = time.monotonic() + 5
        while os.getpriority(os.PRIO_PROCESS, process.pid) != nice and time.monotonic() < deadline:
            time.sleep(0.01)  # `nice` sets it just before it starts the busy loop
        assert os.getpriority(os.PRIO_PROCESS, process.pid) == nice
        assert (os.getsid(process.pid) != os.getsid(0)) is own_session
    assert process.poll() is not None


def test_no_neighbour_and_unknown_modes():
    with neighbour("none") as process:
        assert process is None
    with pytest.raises(ValueError, match="unknown neighbour"):
        with neighbour("nice5"):
            pass
