"""Algorithms, registered by name. Importing this package registers them all."""
from .base import ALGORITHMS, Algorithm, Setup, get_algorithm, register  # noqa: F401
from . import dense, allgather_based  # noqa: F401  (registration side effects)
