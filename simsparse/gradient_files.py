"""Recorded gradients on disk: the files a ``workload: {source: {path, key}}``
replays (:class:`FileSource`), and :func:`record_gradients`, which writes
them from a torch model's ``.grad``\\ s (:mod:`simsparse.workload`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class FileSource:
    """Recorded gradients: array ``key`` of ``path.format(rank=, iteration=)``."""

    path: str
    key: str = "grad"

    def file(self, rank: int, iteration: int) -> Path:
        try:
            return Path(self.path.format(rank=rank, iteration=iteration))
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"workload.source.path {self.path!r}: only {{rank}} and {{iteration}} may appear "
                             f"in braces ({e})") from None

    def read(self, rank: int, iteration: int) -> tuple[np.ndarray, tuple | None]:
        """The flat gradient and the layer sizes stored with it (if any)."""
        f = self.file(rank, iteration)
        if not f.is_file():
            raise FileNotFoundError(f"workload.source: {f} not found (rank {rank}, iteration {iteration}; "
                                    f"pattern {self.path!r})")
        with np.load(f) as z:
            if self.key not in z.files:
                raise ValueError(f"workload.source: {f} has no array {self.key!r}; it has {', '.join(z.files)}")
            g = np.asarray(z[self.key]).reshape(-1)
            layers = tuple(int(s) for s in z["layers"]) if "layers" in z.files else None
        return g, layers


def record_gradients(parameters, path: str, rank: int, iteration: int, key: str = "grad") -> Path:
    """Save the ``.grad`` of torch ``parameters`` (registration order, zeros
    where a gradient is missing) as one flat float32 vector under ``key``,
    with the per-tensor sizes under ``layers``, to
    ``path.format(rank=rank, iteration=iteration)``: a file a
    ``source: {path, key}`` workload replays."""
    parts, sizes = [], []
    for p in parameters:
        g = p.grad
        flat = np.zeros(p.numel(), np.float32) if g is None else g.detach().cpu().reshape(-1).float().numpy()
        parts.append(flat)
        sizes.append(p.numel())
    out = FileSource(path, key).file(rank, iteration)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, **{key: np.concatenate(parts), "layers": np.asarray(sizes, dtype=np.int64)})
    return out
