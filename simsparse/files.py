"""Plain file helpers every layer may use: atomic writes, and YAML loaded
with a cap on alias expansion (a "billion laughs" document is refused)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml

#: nodes one YAML document may expand to through its aliases; the largest
#: config, topology or profile in the repository has a few thousand
MAX_YAML_NODES = 100_000


class YamlTooLarge(ValueError):
    """A YAML document whose aliases expand past :data:`MAX_YAML_NODES`, or
    (:class:`SelfAlias`) a value that contains itself."""


class SelfAlias(YamlTooLarge):
    """An alias inside the value of its own anchor (``a: &r [*r]``)."""

    def __init__(self, anchor: str, mark, start):
        self.anchor, self.mark, self.start = anchor, mark, start
        super().__init__(f"the anchor &{anchor} refers to itself: the alias *{anchor} at {_at(mark)} is inside the "
                         f"value &{anchor} names (from {_at(start)}), which would contain itself without end; "
                         f"allowed: an alias to an anchor whose value ends before the alias")


def _at(mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def atomic_write(path: Path, write) -> None:
    """Call ``write(tmp_path)`` then rename the temporary file onto ``path``.
    The file gets the usual mode (0666 less the umask; ``mkstemp`` makes 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class _CappedLoader(yaml.SafeLoader):
    """A SafeLoader that counts the nodes it builds, an alias's target once
    per use, and stops past :data:`MAX_YAML_NODES`; and refuses a value that
    contains itself (an alias to a list or mapping still being composed, its
    end not yet read) before anything walks the cycle."""

    def __init__(self, stream):
        super().__init__(stream)
        self._sizes: dict[int, int] = {}

    def compose_node(self, parent, index):
        alias = self.peek_event() if self.check_event(yaml.AliasEvent) else None
        node = super().compose_node(parent, index)
        if alias is not None and isinstance(node, yaml.CollectionNode) and node.end_mark is None:
            raise SelfAlias(alias.anchor, alias.start_mark, node.start_mark)
        return node

    def compose_document(self):
        node = super().compose_document()
        self._check(node)
        return node

    def _check(self, root) -> None:
        # the size of a node, counting every alias use in full, memoized per node (a DAG: no blow-up here)
        sizes = self._sizes
        stack = [(root, False)]
        while stack:
            node, done = stack.pop()
            if id(node) in sizes:
                continue
            kids = (node.value if isinstance(node, yaml.SequenceNode)
                    else [x for kv in node.value for x in kv] if isinstance(node, yaml.MappingNode) else [])
            if not done:
                stack.append((node, True))
                stack.extend((k, False) for k in kids if id(k) not in sizes)
                continue
            n = 1 + sum(sizes.get(id(k), 1) for k in kids)
            if n > MAX_YAML_NODES:
                raise YamlTooLarge(f"its aliases expand to more than {MAX_YAML_NODES:,} values (a YAML alias bomb?)")
            sizes[id(node)] = n


def yaml_load(text):
    """``yaml.safe_load`` with the alias cap: :class:`YamlTooLarge` past it."""
    loader = _CappedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
