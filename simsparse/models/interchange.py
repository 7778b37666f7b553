"""Per-layer tables in and out: what users of other tools already have.

A per-layer CSV holds one row per gradient tensor, in registration order
(the order ``model.parameters()`` gives; gradients become ready in reverse):

    name,elements,forward_s,backward_s
    embed.weight,38597376,0.00021,0.00043

``elements`` is the tensor's parameter count, ``forward_s`` and
``backward_s`` its forward time and its backward interval (until its
gradient is ready) in seconds, on the device and at the batch size the user
measured or estimated them. :func:`read_layer_csv` turns it into a model
table (``simsparse.compute.models.model_table``) whose times are used as
given on every device; :func:`write_layer_csv` writes any model's times on a
device profile in the same format.
"""
from __future__ import annotations

import csv
from pathlib import Path

#: the columns a per-layer CSV needs
COLUMNS = ("name", "elements", "forward_s", "backward_s")


def read_layer_csv(path: str) -> dict:
    """The table of a per-layer CSV (module docstring), or ValueError naming the file, the row and the column."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
            header = list(rows[0]) if rows else []
    except OSError as e:
        raise ValueError(f"layer table {path}: {e.strerror}") from None
    missing = [c for c in COLUMNS if c not in header]
    if not rows or missing:
        raise ValueError(f"layer table {path}: " + (f"no column {', '.join(missing)}" if rows else "no rows") +
                         f"; a per-layer CSV needs the columns {', '.join(COLUMNS)} (elements a count, the times in "
                         f"seconds)")
    tensors = []
    for i, r in enumerate(rows, start=2):
        try:
            size, fwd, bwd = int(r["elements"]), float(r["forward_s"]), float(r["backward_s"])
        except (TypeError, ValueError):
            raise ValueError(f"layer table {path}, line {i}: elements must be an integer and forward_s, backward_s "
                             f"numbers (got {r['elements']!r}, {r['forward_s']!r}, {r['backward_s']!r})") from None
        if size < 1 or fwd < 0 or bwd < 0:
            raise ValueError(f"layer table {path}, line {i}: elements >= 1 and times >= 0 (got {size}, {fwd}, {bwd})")
        tensors.append({"name": r["name"], "size": size, "t_fwd_s": fwd, "t_bwd_s": bwd})
    return {"spec": str(path), "input": "per-layer times from a table", "source": f"per-layer times read from {path}",
            "total_params": sum(t["size"] for t in tensors), "num_tensors": len(tensors), "tensors": tensors}


def write_layer_csv(profile, path: Path, names=None) -> Path:
    """``profile`` (a :class:`~simsparse.compute.models.ModelProfile`) as a per-layer CSV; ``names``: the
    tensors' names (default ``tensor0``, ``tensor1``, ...)."""
    names = names or [f"tensor{i}" for i in range(len(profile.sizes))]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for name, size, fwd, bwd in zip(names, profile.sizes, profile.t_fwd, profile.t_bwd):
            w.writerow([name, size, repr(float(fwd)), repr(float(bwd))])
    return path
