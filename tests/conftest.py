"""Settings for the whole suite. Shared helpers live in tests/helpers.py."""
import os

from hypothesis import settings

# Property tests draw the same examples on every run, so CI is deterministic;
# HYPOTHESIS_EXPLORE=1 draws fresh random examples (and more of them) to hunt bugs.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", max_examples=300, deadline=None)
settings.load_profile("explore" if os.environ.get("HYPOTHESIS_EXPLORE") else "ci")
