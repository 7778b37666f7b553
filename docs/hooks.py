"""mkdocs hook: the pages that are generated from the code, so they cannot go stale.

* ``reference/config.md``: every config key, from the pydantic schemas the
  config loader validates with (type, default, what it means);
* ``algorithms/<family>.md``: one page per algorithm family, from the
  docstrings of its module (the paper, the cost model, the departures) and of
  each registered class, with its parameters;
* ``reference/evaluators.md``: the evaluator table, with each evaluator's cost.

They exist only in the built site (``mkdocs build``); nothing is written to ``docs/``.
"""
from __future__ import annotations

import inspect
import typing
from collections import defaultdict

from mkdocs.structure.files import File


def _type(annotation) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation).replace("typing.", "")
    return text.replace("|", "\\|")


def _default(field) -> str:
    if field.is_required():
        return "required"
    value = field.default if field.default_factory is None else field.default_factory()
    return f"`{value!r}`"


def _fields(model) -> list[str]:
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for name, f in model.model_fields.items():
        desc = (f.description or "").replace("\n", " ").replace("|", "\\|")
        rows.append(f"| `{name}` | {_type(f.annotation)} | {_default(f)} | {desc} |")
    return rows


def _doc(obj) -> str:
    return inspect.cleandoc(obj.__doc__ or "").replace("\n#", "\n\\#")


def config_reference() -> str:
    from simsparse.algorithms import ALGORITHMS
    from simsparse.compute.devices import DeviceProfile
    from simsparse.experiments.config.schema import TOP_KEYS
    from simsparse.experiments.config.schema import __doc__ as top_doc
    from simsparse.experiments.config.specs import RunSpec, SourceSpec, TrainingSpec, WorkloadSpec
    from simsparse.network import NETWORK_SPECS
    from simsparse.schedules import SCHEDULES
    from simsparse.schedules.stack import Stack

    out = ["# Config reference", "",
           "Generated from the schemas `simsparse run` validates a config with: every key, its type, its default "
           "and what it means. A list where one value is expected expands into a grid.", "",
           "## Top level", "", "```text", inspect.cleandoc(top_doc).split("\n\n")[1], "```", "",
           "Keys: " + ", ".join(f"`{k}`" for k in TOP_KEYS) + ".", "", "### Run keys", "", *_fields(RunSpec), "",
           "## `model` (a training iteration)", "", _doc(TrainingSpec), "", *_fields(TrainingSpec), "",
           "## `workload`", "", _doc(WorkloadSpec), "", *_fields(WorkloadSpec), "", "### `workload.source`", "",
           *_fields(SourceSpec), "", "## `network`", ""]
    for name, spec in NETWORK_SPECS.items():
        out += [f"### `model: {name}`", "", _doc(spec), "", *_fields(spec), ""]
    out += ["## `compute` (a device profile)", "", _doc(DeviceProfile), "", *_fields(DeviceProfile), "",
            "## `stack` (the software stack of a training iteration)", "", _doc(Stack), "", *_fields(Stack), ""]
    for field in Stack.model_fields.values():
        for sub in typing.get_args(field.annotation) or (field.annotation,):
            if isinstance(sub, type) and hasattr(sub, "model_fields"):
                out += [f"### `stack` / {sub.__name__}", "", *_fields(sub), ""]
    out += ["## `algorithms` parameters", ""]
    for name, cls in sorted(ALGORITHMS.items()):
        out += [f"### `{name}`", "", *(_fields(cls.Params) if cls.Params.model_fields else ["No parameters."]), ""]
    out += ["## `schedules` parameters", ""]
    for name, cls in sorted(SCHEDULES.items()):
        out += [f"### `{name}`", "", *(_fields(cls.Params) if cls.Params.model_fields else ["No parameters."]), ""]
    return "\n".join(out) + "\n"


def algorithm_pages() -> dict[str, str]:
    """One page per module of ``simsparse/algorithms`` that registers algorithms."""
    from simsparse.algorithms import ALGORITHMS

    families = defaultdict(list)
    for name, cls in sorted(ALGORITHMS.items()):
        families[cls.__module__].append((name, cls))
    pages = {}
    for module, members in sorted(families.items()):
        mod = __import__(module, fromlist=["_"])
        stem = module.rsplit(".", 1)[1]
        lines = [f"# {stem}", "", f"`{module}`", "", _doc(mod), ""]
        for name, cls in members:
            lines += [f"## `{name}`", "", _doc(cls), ""]
            if cls.Params.model_fields:
                lines += ["Parameters:", "", *_fields(cls.Params), ""]
        pages[f"algorithms/{stem}.md"] = "\n".join(lines) + "\n"
    return pages


def evaluators_page() -> str:
    from simsparse.backends.evaluators import TABLE

    out = ["# The evaluators", "", "How a point is timed: every evaluator of `simsparse/backends/evaluators.py`, "
           "fastest first within its level, with the cost the work budget charges it. Which one ran is in each "
           "row (`evaluator`, `error_bound`); `simsparse run --explain` says why. The differential harness's "
           "verdicts, evaluator by algorithm by protocol variant, are in [the architecture](../architecture.md).",
           "", "| evaluator | level | what it does | s a message | s a call | chosen by fast/exact |",
           "|---|---|---|---|---|---|"]
    for e in TABLE.values():
        out.append(f"| `{e.name}` | {e.level} | {e.summary} | {e.per_message_s:.3g} | {e.per_call_s:.3g} | "
                   f"{'yes' if e.automatic else 'only when named'} |")
    return "\n".join(out) + "\n"


def on_files(files, config):
    pages = {"reference/config.md": config_reference(), "reference/evaluators.md": evaluators_page(),
             **algorithm_pages()}
    for path, text in pages.items():
        files.append(File.generated(config, path, content=text))
    return files
