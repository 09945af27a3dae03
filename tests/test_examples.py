"""The Hypothesis profiles scale every property test's count (tests/examples.py)."""
from __future__ import annotations

from hypothesis import settings

from tests.examples import SUITE, THOROUGH, examples


def test_the_thorough_profile_gives_ten_times_each_count_and_the_suite_profile_the_count_itself():
    # Catches: examples() ignoring the loaded profile (--hypothesis-profile thorough would then change
    # nothing), or the suite's own counts scaled (the README's command would run more or fewer).
    loaded = settings.get_current_profile_name()
    try:
        settings.load_profile(SUITE)
        assert [examples(n) for n in (1, 6, 12, 300)] == [1, 6, 12, 300]
        settings.load_profile(THOROUGH)
        assert [examples(n) for n in (1, 6, 12, 300)] == [10, 60, 120, 3000]
    finally:
        settings.load_profile(loaded)
