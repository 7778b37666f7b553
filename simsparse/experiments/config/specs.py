"""The pydantic models of a config's sections: workload, run, training."""
from __future__ import annotations

import typing

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ...gradient_files import FileSource
from ...workload import Workload, model_layer_params, resolve_layers
from .hints import did_you_mean


class SourceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="one .npz per rank and iteration, e.g. grads/rank{rank}_iter{iteration}.npz "
                                  "(relative to the working directory)")
    key: str = Field("grad", description="name of the gradient array inside each .npz")


def _probe(source: SourceSpec):
    """The recorded gradient of rank 0, iteration 0 (and its layer sizes)."""
    try:
        return FileSource(source.path, source.key).read(0, 0)
    except (OSError, ValueError) as e:
        raise ValueError(str(e).removeprefix("workload.source: ")) from None


class WorkloadSpec(BaseModel):
    """The ``workload:`` section; its fields are :class:`~simsparse.workload.Workload`'s.
    ``model``/``source`` resolve into ``layers`` and ``n`` (validated in this order)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, description="take n and the layer sizes from a model: a packaged one "
                                                "(simsparse/data/layer_params.json) or one from elsewhere, as the "
                                                "training model key takes it")
    source: SourceSpec | None = Field(None, description="replay recorded gradients instead of generating them")
    layers: list[int] | None = Field(None, min_length=1, validate_default=True,
                                     description="layer sizes in gradient order, summing to n")
    n: int | None = Field(None, gt=0, le=2**31 - 1, validate_default=True,
                          description="gradient elements per rank (may be omitted with model, layers or source)")
    density: float = Field(0.01, gt=0, le=1, description="k/n, the fraction selected by sparse algorithms")
    dtype: typing.Literal["float32", "float64"] = "float32"
    seed: int = Field(0, ge=0)
    distribution: typing.Literal["normal", "laplace", "student_t"] = Field(
        "normal", description="marginal distribution of the values (laplace and student_t: heavy tails, unit variance)")
    df: float = Field(3.0, gt=2, description="degrees of freedom of student_t (> 2: finite variance)")
    overlap: float | None = Field(None, ge=0, le=1, description="fraction of each rank's top-k coordinates shared by "
                                  "all ranks (1 identical, 0 disjoint); unset: independent ranks")
    skew: float = Field(0.0, ge=0, lt=1, description="concentration of the large coordinates at the start of the index "
                        "space: a fraction q^(1-skew) of them lies in the first q (0: uniform)")
    drift: float = Field(1.0, ge=0, le=1, description="change between iterations: g_t = (1-drift) g_(t-1) + noise "
                         "(1: independent iterations, 0: the same gradient every iteration)")
    layer_spread: float = Field(2.0, ge=0, le=30, description="decades over which the per-layer RMS values are spread "
                                "(log-uniform; with layers or model)")

    @field_validator("model")
    @classmethod
    def _known_model(cls, v):
        from ...compute.models import resolve_model

        return v if v is None or v in model_layer_params() else resolve_model(v)

    @field_validator("source")
    @classmethod
    def _source_readable(cls, v):
        if v is not None:
            _probe(v)  # rank 0, iteration 0 must be there
        return v

    @field_validator("layers")
    @classmethod
    def _layers(cls, v, info: ValidationInfo):
        model, source = info.data.get("model"), info.data.get("source")
        if v is None and model is None and source is not None:
            v = _probe(source)[1]
        layers, _ = resolve_layers(model, v, None)
        return None if layers is None else list(layers)

    @field_validator("n")
    @classmethod
    def _n(cls, v, info: ValidationInfo):
        layers, source = info.data.get("layers"), info.data.get("source")
        if source is not None:
            got = len(_probe(source)[0])
            if v is not None and v != got:
                raise ValueError(f"the recorded gradient {source.path!r} (rank 0, iteration 0) has {got} values")
            v = got
        if layers is not None:
            if v is not None and v != sum(layers):
                raise ValueError(f"the layers (or model) sum to {sum(layers)}; omit n or set it to that")
            v = sum(layers)
        if v is None:
            raise ValueError("missing: give n, or model, layers or source to take it from")
        return v

    @model_validator(mode="after")
    def _generator_knobs_need_no_source(self):
        if self.source is not None:
            set_ = [k for k in ("distribution", "overlap", "skew", "drift") if k in self.model_fields_set]
            if set_:
                raise ValueError(f"source replays recorded gradients, so {', '.join(set_)} (settings of synthetic "
                                 f"gradients) cannot be given with it")
        return self

    def check_P(self, P: int) -> str | None:
        """Why these gradients cannot feed P ranks (disjoint top-k sets need P k <= n), or None."""
        return Workload(**self.model_dump()).check_P(P)


class RunSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    P: int = Field(ge=1, le=1 << 20, description="number of ranks")
    iterations: int = Field(3, ge=1, le=100000)
    warmup: int = Field(1, ge=0, le=100000)
    check: bool = True
    data_scale: float = Field(1.0, gt=0, le=1, description="simulator only: carry gradients at this fraction of n and "
                                                           "scale bytes and compute work back up (1 = full size)")
    evaluation: str = Field(
        "fast", description="simulator only: how a point is timed (simsparse.backends.evaluators; `run --explain` "
                            "says why for each point). fast: the fastest evaluators within 1 % of the events "
                            "(a wider declared bound only where the exact path would take over a minute), "
                            "sampled values where the algorithm allows and full ones would take over five seconds to "
                            "draw; exact: only evaluators equal to the events to the bit; events: the reference, "
                            "every message and value through the event engine, every result checked; sampled: fast, "
                            "with sampled values wherever the algorithm allows; or one evaluator's name, forced, on the values "
                            "fast would carry. "
                            "The row's evaluator and error_bound say what ran")

    @field_validator("evaluation")
    @classmethod
    def _evaluation(cls, v):
        from ...backends.evaluators import MODES, RETIRED, TABLE

        allowed = (*MODES, "sampled", *TABLE)
        if v in RETIRED:
            raise ValueError(f"{v!r} is no longer an evaluator; use {RETIRED[v]}")
        if v not in allowed:
            raise ValueError(f"{v!r} is not allowed{did_you_mean(v, allowed)}; allowed: fast (the default), exact, "
                             f"events, sampled, or an evaluator: {', '.join(TABLE)}")
        return v


class TrainingSpec(BaseModel):
    """The training keys: a model, its batch size per rank, a schedule."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(description="a packaged model (simsparse list shows them), a model from elsewhere "
                                   "(hf:GPT2Config, hf:LlamaConfig(num_hidden_layers=16, seq=2048), "
                                   "torchvision:vit_b_16, package.module:function(image=(3, 32, 32))) or a table "
                                   "written by simsparse model import (a .json path)")
    batch_size: int | None = Field(None, ge=1, le=1 << 20, description="samples per rank per iteration "
                                                                        "(default: the model's, from its paper)")
    density: float | None = Field(None, gt=0, le=1, description="this model's k/n (overrides workload.density)")

    @field_validator("model")
    @classmethod
    def _known(cls, v):
        from ...compute.models import resolve_model

        return resolve_model(v)   # built or read now: a model that cannot be used is refused here, with its key

    @model_validator(mode="after")
    def _batch(self):
        from ...compute.models import default_batch_size

        if self.batch_size is None:
            self.batch_size = default_batch_size(self.model)
        return self
