"""The planner's step time from a measured compute (lightning_fullgraph.planner.step)."""
import pytest

from lightning_fullgraph.planner import predicted_step_seconds


def test_without_contention_overlap_is_free():
    # The compute plus what the work in flight does not hide, no less than the link is busy
    # with what the step waits for, plus the codec; nothing exposed given: nothing hidden.
    assert predicted_step_seconds(3.0, 5.0, 4.0) == 7.0
    assert predicted_step_seconds(3.0, 5.0, 0.5, link=5.0) == 5.0
    assert predicted_step_seconds(3.0, 5.0, 0.5, link=0.0, codec=0.25) == 3.75
    assert predicted_step_seconds(3.0, 5.0, codec=0.5) == 8.5


def test_contention_slows_the_compute_by_what_is_in_flight():
    # A reference that computed 3.0 s with 1.0 s of its transfers in flight beside it, on a
    # link whose transfers cost 0.5 s of compute per second: 2.5 s alone.
    kw = dict(contention=0.5, reference_hidden=1.0)
    assert predicted_step_seconds(3.0, 5.0, 4.0, **kw) == pytest.approx(7.0)  # itself
    assert predicted_step_seconds(3.0, 0.0, 0.0, **kw) == pytest.approx(2.5)  # nothing sent
    # 2 s hidden: 2.5 + 0.5 * 2 compute, plus 0.5 exposed, plus the codec.
    assert predicted_step_seconds(3.0, 2.5, 0.5, link=2.5, codec=0.1, **kw) == \
        pytest.approx(0.1 + 4.0)
    # Background transfers in flight past the whole step (the pipeline: 10 s of link, none
    # waited for): the compute is slowed throughout, C = 2.5 + 0.5 C, not by all 10 s.
    assert predicted_step_seconds(3.0, 10.0, 0.0, link=0.0, **kw) == pytest.approx(5.0)
    # A reference whose transfers outlasted its compute: only its compute was slowed.
    assert predicted_step_seconds(3.0, 0.0, 0.0, contention=0.5, reference_hidden=9.0) == \
        pytest.approx(1.5)


def test_bad_contention():
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="contention must be in"):
            predicted_step_seconds(1.0, 1.0, contention=bad)
