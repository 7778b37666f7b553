"""Algorithms, registered by name. Importing this package imports every
module in it (and the compression kernels), which registers them all."""
import importlib
import pkgutil

from .. import compression  # noqa: F401  (registers sparsifier/quantizer kernels)
from .base import ALGORITHMS, Algorithm, Setup, SparseParams, get_algorithm, register  # noqa: F401

for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")
