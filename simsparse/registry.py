"""Registries of named things: algorithms, schedules, kernels, device
profiles and network presets.

One :class:`Registry` serves them all. A name is found, in this order:

* among the names registered in the package (``register``);
* as a dotted path ``package.module:Object`` (``mypkg.sparse:MyAllreduce``),
  imported and checked to be of the registry's kind;
* among the entry points of the registry's group (``simsparse.algorithms``,
  ...) of the installed distributions, read on the first miss.

A miss raises :class:`UnknownName` (a ``KeyError``) whose message says what
is allowed and the closest names. Plugins are looked up by the same names in
every process (a sweep's pool workers, mpiexec's ranks), so a point carries
only its names.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import re
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator

DOTTED = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def did_you_mean(word, choices, template: str = " (did you mean {}?)") -> str:
    """``template`` filled with the closest of ``choices`` (difflib), or ''."""
    if not isinstance(word, str) or not word:
        return ""
    choices = [str(c) for c in choices]
    close = difflib.get_close_matches(word, choices, n=2, cutoff=0.6)
    if not close:  # a prefix such as 'piz_daint' of 'piz_daint_aries'
        close = [c for c in choices if c.startswith(word) or word.startswith(c)][:2]
    if not close or word in close:
        return ""
    return template.format(" or ".join(repr(c) for c in close))


def is_dotted(name) -> bool:
    """Whether ``name`` is a dotted path ``package.module:Object``."""
    return isinstance(name, str) and DOTTED.fullmatch(name) is not None


def import_roots(names) -> list[str]:
    """The folders from which the dotted-path names among ``names`` import
    their top-level package, so that a fresh interpreter (an mpiexec rank)
    given them on PYTHONPATH imports the same plugin."""
    roots = []
    for name in names:
        if not is_dotted(name):
            continue
        try:
            spec = importlib.util.find_spec(name.partition(":")[0].split(".")[0])
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        if spec.submodule_search_locations:  # a package: the folder above it
            where = [str(Path(p).parent) for p in spec.submodule_search_locations]
        elif spec.origin and spec.origin not in ("built-in", "frozen"):
            where = [str(Path(spec.origin).parent)]
        else:
            where = []
        roots += [w for w in where if w not in roots]
    return roots


class UnknownName(KeyError):
    """A name no registry entry, dotted path or entry point resolves; the
    message is one paragraph saying what is allowed."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def import_object(path: str):
    """The object a dotted path ``package.module:Object`` names; ImportError
    or AttributeError (with a message saying which part failed) otherwise."""
    module, _, attr = path.partition(":")
    try:
        obj = importlib.import_module(module)
    except Exception as e:  # a plugin's own import error is the user's to see
        raise ImportError(f"cannot import module {module!r} ({type(e).__name__}: {e}; is its folder on PYTHONPATH "
                          f"or its package installed?)") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"module {module!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


#: every registry made so far (those of the modules imported)
REGISTRIES: list["Registry"] = []


def plugin_entry_points() -> list[tuple[str, str]]:
    """``(what, name)`` of every entry point of the registries' groups."""
    return [(r.what, name) for r in REGISTRIES for name in r.entry_point_names()]


class Registry(Mapping):
    """Named objects of one kind.

    ``what`` names the kind in messages ("algorithm"); ``group`` is the entry
    point group; ``accept(obj, name)`` returns the object to keep (it may
    convert, e.g. a mapping into a profile) or raises TypeError/ValueError;
    ``allowed`` says in words what a plugin object must be; ``builtins()``
    lists names resolved elsewhere (profile and preset files), for messages.
    Iterating gives the registered names only, so plugins a process loaded
    do not change listings."""

    def __init__(self, what: str, group: str, accept: Callable[[Any, str], Any], allowed: str,
                 builtins: Callable[[], list] = lambda: []):
        self.what, self.group, self.accept, self.allowed, self.builtins = what, group, accept, allowed, builtins
        self._items: dict[str, Any] = {}
        self._plugins: dict[str, Any] = {}
        REGISTRIES.append(self)

    # -- registering --------------------------------------------------------------
    def add(self, name: str, obj):
        if name in self._items:
            raise ValueError(f"{self.what} {name!r} registered twice")
        self._items[name] = obj
        return obj

    def named(self, name: str):
        """Class decorator: register the class as ``name`` and set its ``name``."""
        def deco(cls):
            self.add(name, cls)
            cls.name = name
            return cls
        return deco

    # -- mapping -------------------------------------------------------------------
    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name) -> bool:
        try:
            self[name]
        except KeyError:
            return False
        return True

    def __getitem__(self, name):
        if not isinstance(name, str):
            raise UnknownName(f"{self.what}: expected a name, got {name!r}")
        if name in self._items:
            return self._items[name]
        if name in self._plugins:
            return self._plugins[name]
        if is_dotted(name):
            try:
                obj = self.accept(import_object(name), name)
            except (ImportError, AttributeError, TypeError, ValueError) as e:
                raise UnknownName(f"{self.what} {name!r}: {e}; allowed: a dotted path package.module:Object "
                                  f"naming {self.allowed}") from None
            self._plugins[name] = obj
            return obj
        obj = self._entry_point(name)
        if obj is None:
            raise UnknownName(self.unknown(name))
        self._plugins[name] = obj
        return obj

    def get(self, name, default=None):
        obj = self._items.get(name) if isinstance(name, str) else None
        if obj is not None:  # (the simulator's hot path)
            return obj
        try:
            return self[name]
        except KeyError:
            return default

    # -- plugins --------------------------------------------------------------------
    def entry_point_names(self) -> list[str]:
        return sorted({ep.name for ep in metadata.entry_points(group=self.group)})

    def _entry_point(self, name: str):
        for ep in metadata.entry_points(group=self.group):
            if ep.name == name:
                try:
                    return self.accept(ep.load(), name)
                except Exception as e:
                    raise UnknownName(f"{self.what} {name!r} (entry point {ep.value!r} in group {self.group!r}): "
                                      f"{type(e).__name__}: {e}; allowed: an entry point naming {self.allowed}") from None
        return None

    def names(self) -> list[str]:
        """Every name that resolves without a dotted path, sorted."""
        return sorted({*self._items, *self.builtins(), *self.entry_point_names()})

    def unknown(self, name: str) -> str:
        """The one-paragraph message for a name that does not resolve."""
        known = self.names()
        return (f"unknown {self.what} {name!r}{did_you_mean(name, known)}; allowed: {', '.join(known)}, or a dotted "
                f"path package.module:Object naming {self.allowed}")


def subclass_of(base: type) -> Callable[[Any, str], Any]:
    """An ``accept`` taking subclasses of ``base``; an unnamed class gets the
    name it was found by (its ``name`` attribute)."""

    def accept(obj, name: str):
        if not (isinstance(obj, type) and issubclass(obj, base)) or obj is base:
            raise TypeError(f"it is {obj!r}, not a subclass of {base.__module__}.{base.__qualname__}")
        if not obj.__dict__.get("name"):  # (not a name inherited from a built-in it extends)
            obj.name = name
        return obj

    return accept


def instance_of(kind: type) -> Callable[[Any, str], Any]:
    """An ``accept`` taking instances of ``kind``."""

    def accept(obj, name: str):
        if not isinstance(obj, kind):
            raise TypeError(f"it is {obj!r}, not a {kind.__qualname__}")
        return obj

    return accept
