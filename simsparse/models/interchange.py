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

ASTRA-sim 1.0's text workload (Rashidi et al., ISPASS 2020; its
``inputs/workload`` README) is one line ``DATA``, the layer count, then per
layer: name, a reserved integer, then for the forward pass, the input
gradient and the weight gradient each a compute time in cycles, a
collective (``ALLREDUCE``, ``ALLGATHER``, ``ALLTOALL`` or ``NONE``) and its
size in bytes, and last an update delay. :func:`read_astrasim` takes a
data-parallel file into the per-layer rows (elements = the weight-gradient
allreduce's bytes over ``bytes_per_element``; forward = the forward cycles,
backward = input-gradient plus weight-gradient cycles, times ``cycle_s``);
:func:`write_astrasim` writes a model's times back (all backward work as
weight-gradient compute). The cycle and the element size are not in the
file: they are arguments (defaults 1 ns, 4 bytes).

SimAI's workload (Alibaba's ASTRA-sim fork, as its AICB generator writes
it) has the same layer lines under another header: the parallelism type
(``HYBRID_TRANSFORMER_FWD_IN_BCKWD``) followed by ``key: value`` pairs
(``model_parallel_NPU_group``, ``ep``, ``pp``, ``vpp``, ``ga``,
``all_gpus``, ...). :func:`read_simai` takes a file of pure data
parallelism (tensor, expert and pipeline groups of 1, no gradient
accumulation): simsparse simulates the data-parallel dimension alone, so
it refuses the others rather than drop their communication.
:func:`write_simai` writes that header for ``all_gpus`` data-parallel ranks.
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


def _lines(path: str, what: str) -> list[list[str]]:
    try:
        return [ln.split() for ln in Path(path).read_text().splitlines() if ln.strip()]
    except OSError as e:
        raise ValueError(f"{what} {path}: {e.strerror}") from None


def _layers(path: str, lines: list, cycle_s: float, bytes_per_element: int, what: str) -> list[dict]:
    """The layer count (``lines[1]``) and the layer lines after it, shared by ASTRA-sim 1.0 and SimAI."""
    try:
        count = int(lines[1][0])
    except (IndexError, ValueError):
        raise ValueError(f"{what} {path}: the second line must be the number of layers") from None
    rows = []
    for i, f in enumerate(lines[2:2 + count], start=3):
        try:
            fwd, ig, wg, wg_type, wg_bytes = int(f[2]), int(f[5]), int(f[8]), f[9], int(f[10])
        except (IndexError, ValueError):
            raise ValueError(f"{what} {path}, line {i}: expected name, reserved, then three of "
                             f"(compute cycles, collective, bytes) and the update delay") from None
        if wg_type != "ALLREDUCE" or wg_bytes < bytes_per_element:
            raise ValueError(f"{what} {path}, line {i}: layer {f[0]} has no weight-gradient ALLREDUCE "
                             f"of at least one element ({wg_type} {wg_bytes} B); a data-parallel layer needs one")
        rows.append({"name": f[0], "elements": wg_bytes // bytes_per_element, "forward_s": fwd * cycle_s,
                     "backward_s": (ig + wg) * cycle_s})
    if len(rows) != count:
        raise ValueError(f"{what} {path}: says {count} layers, holds {len(rows)}")
    return rows


def read_astrasim(path: str, cycle_s: float = 1e-9, bytes_per_element: int = 4) -> list[dict]:
    """The layers of an ASTRA-sim 1.0 data-parallel workload file as per-layer rows (module docstring)."""
    what = "ASTRA-sim workload"
    lines = _lines(path, what)
    if not lines or lines[0][0] != "DATA":
        raise ValueError(f"{what} {path}: the first line must be DATA (a data-parallel workload); "
                         f"got {' '.join(lines[0]) if lines else 'nothing'}")
    return _layers(path, lines, cycle_s, bytes_per_element, what)


#: SimAI header keys that must be 1 in a data-parallel workload, with what each would need
SIMAI_ONE = {"model_parallel_NPU_group": "tensor parallelism", "ep": "expert parallelism",
             "pp": "pipeline parallelism", "ga": "gradient accumulation"}


def read_simai(path: str, cycle_s: float = 1e-9, bytes_per_element: int = 4) -> list[dict]:
    """The layers of a SimAI data-parallel workload file as per-layer rows (module docstring)."""
    what = "SimAI workload"
    lines = _lines(path, what)
    head = lines[0] if lines else []
    if not head or not head[0].startswith("HYBRID"):
        raise ValueError(f"{what} {path}: the first line must be SimAI's parallelism line "
                         f"(HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 1 ...); got "
                         f"{' '.join(head) or 'nothing'}")
    keys = dict(zip([k.rstrip(":") for k in head[1::2]], head[2::2]))
    for key, needs in SIMAI_ONE.items():
        if keys.get(key, "1") != "1":
            raise ValueError(f"{what} {path}: {key}: {keys[key]}; allowed: 1 (simsparse simulates data "
                             f"parallelism; {needs} would add communication it does not model)")
    return _layers(path, lines, cycle_s, bytes_per_element, what)


def write_rows_csv(rows: list[dict], path: Path) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


def write_astrasim(profile, path: Path, cycle_s: float = 1e-9, bytes_per_element: int = 4, names=None,
                   header: str = "DATA") -> Path:
    """``profile`` as an ASTRA-sim 1.0 data-parallel workload file (module docstring)."""
    names = names or [f"tensor{i}" for i in range(len(profile.sizes))]
    lines = [header, str(len(profile.sizes))]
    for name, size, fwd, bwd in zip(names, profile.sizes, profile.t_fwd, profile.t_bwd):
        lines.append(f"{name} -1 {round(fwd / cycle_s)} NONE 0 0 NONE 0 {round(bwd / cycle_s)} ALLREDUCE "
                     f"{size * bytes_per_element} 0")
    Path(path).write_text("\n".join(lines) + "\n")
    return path


def write_simai(profile, path: Path, gpus: int, cycle_s: float = 1e-9, bytes_per_element: int = 4,
                names=None) -> Path:
    """``profile`` as a SimAI workload of ``gpus`` data-parallel ranks (module docstring)."""
    header = (f"HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 1 ep: 1 pp: 1 vpp: 1 ga: 1 "
              f"all_gpus: {int(gpus)} checkpoints: 0 checkpoint_initiates: 0")
    return write_astrasim(profile, path, cycle_s, bytes_per_element, names, header)
