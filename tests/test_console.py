"""``seqlab.console``: a long silent step is named once it has taken a few seconds, a quick one never."""

import time

from seqlab.console import said_if_slow


def test_a_slow_step_is_said_with_its_time_and_a_quick_one_is_not(capsys):
    with said_if_slow("preparing the data", after=0.05):
        time.sleep(0.3)
    assert capsys.readouterr().err.splitlines() == [
        "preparing the data ...",
        "preparing the data: done in 0 s",
    ]
    with said_if_slow("preparing the data", after=5.0):
        pass
    assert capsys.readouterr().err == ""


def test_a_step_that_fails_is_closed_and_its_error_passes(capsys):
    try:
        with said_if_slow("reading", after=0.01):
            time.sleep(0.1)
            raise KeyError("x")
    except KeyError:
        pass
    else:
        raise AssertionError("the error was swallowed")
    assert "reading ..." in capsys.readouterr().err
