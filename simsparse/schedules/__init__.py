"""Layer-wise schedules of a training iteration, registered by name, and the
planners that decide which gradient tensors are communicated together.
Importing this package registers every schedule."""
from .base import SCHEDULES, PlanCosts, Schedule, get_schedule, register_schedule  # noqa: F401
from . import layerwise  # noqa: F401  (registers the schedules)
from .stack import Stack  # noqa: F401  (registers the stack's kernels)
