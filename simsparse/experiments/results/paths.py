"""Where results go, and that they go nowhere else.

A run writes only inside its results folder: ``--out DIR`` when given, else
``results/<name>`` (``name`` from the config; :mod:`.config` allows no ``/``
and no leading ``.`` in it). Files are replaced by renaming
(:func:`simsparse.files.atomic_write`), which never follows a symbolic link, so what
could lead writes elsewhere is a linked folder: ``results/<name>`` itself or
its ``trace/`` folder. Both are refused when they resolve outside the base
folder (``results/`` itself may be a link, e.g. to a scratch file system).
"""
from __future__ import annotations

from pathlib import Path


class OutsideError(Exception):
    """A results folder that would write outside its base folder."""


def results_dir(name: str, out: str | None, suffix: str = "") -> Path:
    """The folder a run writes to, checked by :func:`confine`."""
    if out:
        return confine(Path(out), Path(out))
    base = Path("results")
    return confine(base / f"{name}{suffix}", base)


def confine(out_dir: Path, base: Path) -> Path:
    """``out_dir`` if it and its ``trace/`` folder resolve inside ``base``."""
    root = base.resolve()
    for d in (out_dir, out_dir / "trace"):
        real = d.resolve()
        if real != root and root not in real.parents:
            raise OutsideError(f"{d} resolves to {real}, outside {root} (a symbolic link?); simsparse writes results "
                               f"only inside {base}. Remove the link, or pass --out with the folder you want")
        if d.exists() and not d.is_dir():
            raise OutsideError(f"{d} exists and is not a folder; simsparse needs a results folder there")
    return out_dir
