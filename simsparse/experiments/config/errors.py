"""The one error a user sees for a bad config or argument (exit status 2)."""


class ConfigError(Exception):
    """A user-facing, one-paragraph description of what is wrong with a config."""


#: the most problems one message lists; the rest are counted
MOST_SHOWN = 6


def listing(problems) -> str:
    """``problems`` joined into one paragraph: the first :data:`MOST_SHOWN`,
    then how many more (a calibrated profile's tables can repeat one problem
    at every size)."""
    problems = list(problems)
    more = f" (and {len(problems) - MOST_SHOWN} more)" if len(problems) > MOST_SHOWN else ""
    return "; ".join(problems[:MOST_SHOWN]) + more
