"""The progress line's ETAs (fedsys_launch.apps.server_app.etas)."""

from __future__ import annotations

import pytest

from fedsys_launch.apps.server_app import etas


def test_the_run_eta_adds_the_later_strategies_rounds_at_this_pace():
    # 3 rounds in 30 s: 10 s a round; 7 rounds of this strategy and 20 of later ones left
    assert etas(30.0, 3, 7, 20) == pytest.approx((70.0, 270.0))


def test_the_last_strategy_has_equal_etas_and_no_round_done_is_no_division_by_zero():
    assert etas(12.0, 4, 2, 0) == pytest.approx((6.0, 6.0))
    # a resumed strategy's first round: the pace is this process's, never a division by 0
    assert etas(5.0, 0, 3, 0) == pytest.approx((15.0, 15.0))
