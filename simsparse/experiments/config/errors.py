"""The one error a user sees for a bad config or argument (exit status 2)."""


class ConfigError(Exception):
    """A user-facing, one-paragraph description of what is wrong with a config."""
