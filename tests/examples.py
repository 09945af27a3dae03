"""How many examples each property test draws: its own count, scaled by the Hypothesis profile.

Every property test states the count the README's command runs (``examples(n)``): enough to
catch the bug its docstring names, within the suite's time. A change to the Leap Frog, the
generators or the decoders deserves more, and the ``thorough`` profile gives every test ten
times its count::

    pytest --hypothesis-profile thorough tests/test_leapfrog_properties.py

Profiles are registered by tests/conftest.py, before pytest's Hypothesis plugin loads the one
named on the command line; test modules are imported after that, so ``examples`` sees it.
"""
from __future__ import annotations

from hypothesis import settings

# The profile the README's command uses, and the thorough one: a scale of every test's count.
SUITE, THOROUGH = "suite", "thorough"
SCALES = {SUITE: 1, THOROUGH: 10}
_BASE = 100  # max_examples of the "suite" profile (Hypothesis' default): the scale is the loaded profile's over it


def register_profiles() -> None:
    for name, scale in SCALES.items():
        settings.register_profile(name, max_examples=_BASE * scale)
    settings.load_profile(SUITE)


def examples(count: int) -> int:
    """``count`` scaled by the loaded profile: its own in the suite, ten times it with ``thorough``."""
    return max(1, count * settings.default.max_examples // _BASE)
