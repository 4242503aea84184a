"""sim.clock.Environment.try_advance: a step that ends before the next queued event moves the clock
at once; one that does not leaves it to a Timeout; time never goes back."""
import pytest

from sim.clock import Environment, UrgentTimeout


def test_try_advance_moves_only_before_the_next_event():
    env = Environment()
    assert env.try_advance(5) and env.now == 5  # nothing queued
    UrgentTimeout(env, 10)  # an arrival at 15
    assert not env.try_advance(15) and env.now == 5  # at the arrival's time: the arrival goes first
    assert env.try_advance(14) and env.now == 14
    with pytest.raises(ValueError, match="before now=14"):
        env.try_advance(13)
