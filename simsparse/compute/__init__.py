"""Compute: kernels (numpy + torch implementations and their work) and the
device cost models. Importing the package registers every core kernel."""
from . import kernels, sparse_kernels  # noqa: F401
from .kernels import KERNELS, Work, get_kernel, kernel  # noqa: F401
