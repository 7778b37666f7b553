"""Compute cost models: how long a kernel call takes on a device.

* ``ideal``: every kernel costs zero (isolates communication).
* ``parametric``: ``launch_s + per-element cost``. By default a kernel is
  memory-bound (a roofline): ``launch_s + work.bytes / mem_bandwidth_Bps``.
  A profile may override any kernel with its own ``launch_s``, ``per_elem_s``
  and ``complexity`` (``n`` or ``nlogn``), e.g. top-k by sorting, fitted as
  ``s * d * log2(d)`` in the OMGS-SGD code; ``per_part_s`` for each input
  beyond the first of a kernel that loops over its inputs (``Work.parts``);
  and each code path of a kernel on its own (``"name/path"``, ``Work.path``).

Profiles are YAML files in ``simsparse/compute/profiles/`` (named by file
stem) or any path; every number in them cites its source.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..registry import Registry, is_dotted
from ..files import YamlTooLarge, yaml_load
from ..size_scale import DensityScale, SizeScale
from .kernels import Work
from .message_path import PathCosts
from .noise import NoiseBand

PROFILE_DIR = Path(__file__).parent / "profiles"


class KernelCost(BaseModel):
    model_config = ConfigDict(extra="forbid")
    launch_s: float | None = Field(None, ge=0, description="overrides the device's launch_s")
    per_elem_s: float = Field(ge=0, description="seconds per element (or per n*log2(n) unit)")
    complexity: Literal["n", "nlogn"] = "n"
    per_part_s: float = Field(0.0, ge=0, description="seconds per input beyond the first of a kernel that loops over "
                                                     "its inputs (Work.parts; simsparse calibrate)")
    size_scale: SizeScale | None = Field(
        None, description="[[elements, factor], ...]: the line's time times this factor, interpolated in log size and "
                          "constant beyond the ends (memory regimes one line cannot follow; simsparse calibrate)")
    back_to_back_scale: SizeScale | None = Field(
        None, description="[[elements, factor], ...]: a call right after a call of the same kernel on its rank, with "
                          "no message posted and no wait between, takes its time times this factor (its operands, "
                          "its temporaries' blocks and the code are still hot: top-k's count in a loop that moves "
                          "the threshold took 11 us back to back against 35 us after another kernel, at 3e3 on "
                          "this project's host); interpolated as size_scale. The line is fitted from the calls "
                          "that follow something else (simsparse calibrate: each algorithm run's back-to-back "
                          "calls over its first ones)")
    select_scale: DensityScale | None = Field(
        None, description="a sparse kernel's factor over size and density (the entries it selects or scatters over "
                          "its elements, Work.select), 1 at the density the line was fitted at: at one size its time "
                          "moves with them (torch's CPU top-k keeps a heap of k below k = n/64 and selects in place "
                          "above; a scatter-add's random writes; simsparse calibrate times a grid)")

    #: keys of older profiles, and what to do about them (the config loader's message)
    RENAMED: ClassVar[dict] = {"after_idle": "an older profile's: it became idle_excess, what an idle adds to the "
                                             "call; calibrate again (simsparse calibrate, or validate --recalibrate)"}

    idle_excess: list[tuple[float, list[tuple[int, float]]]] | None = Field(
        None, description="[[idle_s, [[elements, seconds], ...]], ...]: what a call takes beyond its line when its "
                          "rank has just woken from idling idle_s, in a blocking wait or before the run's start "
                          "(simsparse calibrate: each rank in turn sleeps, makes a small call of the kernel, which "
                          "takes the wake-up's own cost, and then the timed one, against the same calls back to "
                          "back; on a VM a core that idled milliseconds finds the operands out of its caches): "
                          "interpolated linearly in log idle and log size, in proportion below the smallest size, "
                          "the largest size's beyond it, nothing below the shortest idle")

    def idle_extra(self, elems: float, idle_s: float) -> float:
        """Seconds a call on ``elems`` takes beyond its line after its rank idled ``idle_s`` (0: none)."""
        rows = self.idle_excess
        if not rows or idle_s < rows[0][0]:
            return 0.0
        extra = [_loglin(pts, max(elems, 1.0)) for _, pts in rows]
        if idle_s >= rows[-1][0] or len(rows) == 1:
            return extra[-1]
        i = next(i for i in range(1, len(rows)) if idle_s < rows[i][0])
        w = math.log(idle_s / rows[i - 1][0]) / math.log(rows[i][0] / rows[i - 1][0])
        return extra[i - 1] + w * (extra[i] - extra[i - 1])

    def scale(self, elems: float) -> float:
        """``size_scale`` at ``elems``."""
        return _interp(self.size_scale, elems)

    def back_to_back(self, elems: float) -> float:
        """``back_to_back_scale`` at ``elems``."""
        return _interp(self.back_to_back_scale, elems)


def _interp(sc, elems: float) -> float:
    """A ``[[elements, factor], ...]`` scale at ``elems``: linear in log size, constant beyond its ends; 1 without one."""
    if not sc:
        return 1.0
    if elems <= sc[0][0]:
        return sc[0][1]
    for (x0, f0), (x1, f1) in zip(sc, sc[1:]):
        if elems <= x1:
            w = math.log(elems / x0) / math.log(x1 / x0)
            return f0 + w * (f1 - f0)
    return sc[-1][1]


def _loglin(pts, x: float) -> float:
    """``pts`` ([[x, y], ...], x increasing) at ``x``: linear in log x, y / x kept below the first, the last y beyond."""
    if x <= pts[0][0]:
        return pts[0][1] * x / pts[0][0]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + math.log(x / x0) / math.log(x1 / x0) * (y1 - y0)
    return pts[-1][1]


class ModelTimes(BaseModel):
    """Measured per-tensor times of one model at one batch size (registration order)."""

    model_config = ConfigDict(extra="forbid")
    batch_size: int = Field(ge=1)
    t_fwd: list[float]
    t_bwd: list[float]
    noise: list[NoiseBand] | None = Field(None, description="the spread of a forward or backward piece's time "
                                          "around its median, from the timing's repetitions (compute.noise); "
                                          "absent: the pieces draw from the device's kernel_noise")
    settings: dict | None = Field(None, description="what decided the times (simsparse model profile: device, dtype, "
                                  "torch, compile, batch): a config at another batch size is refused rather than "
                                  "timed by the roofline")


class NetworkStack(BaseModel):
    """The host's TCP/IP stack (simsparse.calibration.stack_probe): core-seconds per payload byte on the sending
    host's cores, outside the ranks' processes, and inside each end's own send and receive calls, consumed at
    ``rate_Bps`` while the message moves."""
    model_config = ConfigDict(extra="forbid")
    cpu_per_byte_s: float = Field(ge=0, description="core-seconds of softirq and kernel work per payload byte")
    rate_Bps: float = Field(gt=0, description="the pace at which it is spent: a single stream's payload rate")
    send_cpu_per_byte_s: float = Field(0.0, ge=0, description="core-seconds of the sending rank's own process per "
                                       "payload byte: the kernel's TCP work inside its send calls (system time)")
    recv_cpu_per_byte_s: float = Field(0.0, ge=0, description="the same inside the receiving rank's receive calls")


class DeviceProfile(BaseModel):
    """A parametric device."""

    model_config = ConfigDict(extra="forbid")
    name: str = "custom"
    model: Literal["parametric"] = "parametric"
    launch_s: float = Field(0.0, ge=0, description="fixed cost of every kernel call")
    mem_bandwidth_Bps: float = Field(gt=0, description="memory bandwidth for memory-bound kernels")
    peak_flops: float | None = Field(None, gt=0, description="FP32 peak in FLOP/s (model profiles: convolutions and "
                                                              "matmuls)")
    compute_efficiency: float = Field(1.0, gt=0, le=1, description="achieved fraction of peak_flops on a real "
                                                                   "network's layers")
    peak_bf16_flops: float | None = Field(None, gt=0, description="dense BF16 tensor-core peak in FLOP/s: the matrix "
                                          "ops of a model counted with dtype='bf16' (mixed precision) run at it")
    compute_efficiency_bf16: float | None = Field(None, gt=0, le=1, description="achieved fraction of "
                                                  "peak_bf16_flops (none: compute_efficiency)")
    kernels: dict[str, KernelCost] = Field(default_factory=dict)
    models: dict[str, ModelTimes] = Field(default_factory=dict, description="measured per-tensor forward/backward "
                                          "times (simsparse calibrate); used instead of the roofline at that batch size")
    shared_cores: float | None = Field(None, gt=0, le=4096,
                                       description="the ranks of a run share this many cores: their device work is "
                                                   "processor-shared (ranks on one host's CPU, e.g. the testbed); "
                                                   "none: every rank has its device to itself")
    core_binding: Literal["none", "block"] = Field("none", description="with shared_cores: 'none', the ranks share "
                                                  "one pool of cores; 'block', rank r is bound to core r*C/P and "
                                                  "shares it with its block of ranks only (the testbed binds them)")
    core_slice_s: float | None = Field(None, gt=0, le=1.0, description="with shared_cores: the scheduler's time slice: "
                                       "a rank keeps its core until it blocks or has run this long, then the next "
                                       "runnable rank gets it (round robin; simsparse calibrate measures it); none: "
                                       "processor sharing")
    message_cpu_s: float | None = Field(None, ge=0, description="with shared_cores: core-seconds each posted send and "
                                        "receive costs its rank, beside the transfer (simsparse calibrate: from the "
                                        "steady steps of an exchange of small messages with every rank busy)")
    wait_cpu_s: float | None = Field(None, ge=0, description="with shared_cores: core-seconds a rank spends each "
                                     "time it wakes from a blocking wait, beside message_cpu_s per request "
                                     "(simsparse calibrate: an all-to-all of small messages against the exchange)")
    wait_poll_s: float | None = Field(None, gt=0, description="with shared_cores and wait_cpu_s: a rank blocked in a "
                                      "wait wakes every this many seconds and spends wait_cpu_s each time (the real "
                                      "backend's poll on a testbed: backends.real.wire.SocketSleep's longest timeout)")
    wait_poll_after_s: float | None = Field(None, ge=0, description="with wait_poll_s: the first such wake-up comes "
                                            "this long after the rank blocks (SocketSleep's yielding and its timeouts "
                                            "doubling up to wait_poll_s; shorter waits are in wait_cpu_s itself)")
    start_idle_s: float | None = Field(None, ge=0, description="with shared_cores: how long each rank has "
                                       "idled, asleep, when a run starts: its first kernel pays idle_excess for it "
                                       "(the real backend's common start on a testbed sleeps its ranks until at "
                                       "least backends.real.start's MIN_MARGIN_S after the last one arrived; "
                                       "simsparse calibrate --testbed)")
    start_pause_s: float | None = Field(None, ge=0, description="how long the network idles before each run: "
                                        "the real backend's common start on a testbed begins a run at least "
                                        "backends.real.start's MIN_MARGIN_S after the last rank arrived, spinning "
                                        "or asleep; a shaped link's token bucket refills meanwhile (simsparse "
                                        "calibrate --testbed; absent: no pause)")
    start_cpu_s: float | None = Field(None, ge=0, description="with shared_cores: core-seconds each rank spends on "
                                      "a run's first steps beyond message_cpu_s, charged as the run starts "
                                      "(simsparse calibrate: a short exchange against a long one)")
    network_stack: NetworkStack | None = Field(None, description="with shared_cores on a TCP fabric: the kernel's "
                                               "network stack, run on the sender's cores beside the ranks (simsparse "
                                               "calibrate --testbed: calibration.stack_probe)")
    message_path: PathCosts | None = Field(None, description="with shared_cores: the real backend's CPU per message "
                                           "on each side, per wire format (dense, split, packed), measured around "
                                           "every message of the calibration's algorithm runs (compute.message_path)")
    program_cpu_s: float | None = Field(None, ge=0, description="with shared_cores: core-seconds a rank's program "
                                        "and its driver spend before each kernel (the Python between two requests; "
                                        "simsparse calibrate: the real driver's steps over every algorithm)")
    kernel_noise: list[NoiseBand] | None = Field(None, description="the spread of a kernel call's time around its "
                                                "median, per band of call time (compute.noise; simsparse calibrate: "
                                                "every kernel call of its algorithm runs)")
    noise_seed: int = Field(0, ge=0, lt=1 << 15, description="which draws of kernel_noise and of a model's own "
                            "noise a run takes (compute.noise: every seed another independent set, each the "
                            "same from run to run; simsparse validate predicts a short point with seeds 0 to "
                            "R - 1, as it measures it R times)")
    speed_probe_s: float | None = Field(None, gt=0, description="the host speed probe's time at calibration "
                                        "(simsparse calibrate; compute.speed_probe): what a measured point's "
                                        "probe is compared with")
    speed_probe_clock: Literal["cpu", "wall"] | None = Field(None, description="the clock of speed_probe_s: the one "
                                                             "the kernels were timed with")
    speed_probe_calls_s: dict[str, float] | None = Field(None, description="each call of the speed probe at "
                                                         "calibration, its median (compute.speed_probe.slowdown "
                                                         "takes their ratios' geometric mean)")
    slowdown: float = Field(1.0, gt=0, description="every kernel and layer takes this multiple of its time here "
                                                   "(simsparse validate: the host speed probe before a measured "
                                                   "point over the profile's, compute.speed_probe.slowdown; 1: "
                                                   "the host as calibrated)")
    cpu_slowdown: float | None = Field(None, gt=0, description="with shared_cores, every core-second the ranks and "
                                       "the network stack spend (message, path, wait, start, program and stack "
                                       "CPU) takes this multiple of its time here (compute.speed_probe."
                                       "cpu_slowdown); unset: slowdown")
    source: str | None = None

    @model_validator(mode="after")
    def _whole_cores_when_bound(self):
        whole = (("core_binding: block", self.core_binding == "block"), ("core_slice_s", bool(self.core_slice_s)))
        need = [key for key, on in whole if on]
        if need and self.shared_cores is not None and self.shared_cores != int(self.shared_cores):
            raise ValueError(f"{' and '.join(need)}: a core runs one rank at a time, so shared_cores must be a whole "
                             f"number (got {self.shared_cores})")
        return self


class Device:
    name = "device"
    profile: DeviceProfile | None = None

    def cost(self, kernel: str, work: Work, idle_s: float = 0.0,
             back_to_back: bool = False) -> float:  # pragma: no cover - interface
        raise NotImplementedError


class IdealDevice(Device):
    """Infinitely fast compute: isolates the network."""

    name = "ideal"

    def cost(self, kernel: str, work: Work, idle_s: float = 0.0, back_to_back: bool = False) -> float:
        return 0.0


class ParametricDevice(Device):
    def __init__(self, profile: DeviceProfile):
        self.profile = profile
        self.name = profile.name
        self.shared_cores = profile.shared_cores

    def cost_array(self, kernel: str, elems, nbytes, parts=1.0, select=None):
        """:meth:`cost` of many calls at once (numpy arrays of elements, bytes, parts and, of a selection, the
        entries kept)."""
        import numpy as np

        p = self.profile
        elems, nbytes = np.asarray(elems, float), np.asarray(nbytes, float)
        kc = p.kernels.get(kernel)
        if kc is None:
            return (p.launch_s + nbytes / p.mem_bandwidth_Bps) * p.slowdown
        n = np.maximum(elems, 1.0)
        units = n * np.log2(np.maximum(n, 2.0)) if kc.complexity == "nlogn" else elems
        t = (p.launch_s if kc.launch_s is None else kc.launch_s) + kc.per_elem_s * units
        if kc.per_part_s:
            t = t + kc.per_part_s * (np.asarray(parts, float) - 1.0)
        if kc.size_scale:
            xs, fs = zip(*kc.size_scale)
            t = t * np.interp(np.log(n), np.log(xs), fs)
        if kc.select_scale and select is not None:
            t = t * kc.select_scale.at(n, np.asarray(select, float) / n)
        return t * p.slowdown

    def cost(self, kernel: str, work: Work, idle_s: float = 0.0, back_to_back: bool = False) -> float:
        """Seconds of ``work`` by ``kernel``: its path's own fit where the
        profile has one (``"kernel/path"``), else the kernel's; at least its
        ``idle_excess`` more where its rank just woke from idling ``idle_s``;
        times its ``back_to_back_scale`` where the rank's previous request was
        a call of the same kernel (``back_to_back``)."""
        p = self.profile
        kc = (work.path and p.kernels.get(f"{kernel}/{work.path}")) or p.kernels.get(kernel)
        if kc is None:
            return (p.launch_s + work.bytes / p.mem_bandwidth_Bps) * p.slowdown
        units = work.nlogn if kc.complexity == "nlogn" else work.elems
        launch = p.launch_s if kc.launch_s is None else kc.launch_s
        t = (launch + kc.per_part_s * (work.parts - 1.0) + kc.per_elem_s * units) * p.slowdown
        if kc.size_scale:
            t *= kc.scale(max(work.elems, 1.0))
        if kc.select_scale and work.select:
            t *= kc.select_scale.at(max(work.elems, 1.0), work.select / max(work.elems, 1.0))
        if back_to_back and kc.back_to_back_scale:
            t *= kc.back_to_back(max(work.elems, 1.0))
        if idle_s and kc.idle_excess:
            t += kc.idle_extra(work.elems, idle_s) * p.slowdown
        return t


def builtin_profiles() -> list[str]:
    return sorted(f.stem for f in PROFILE_DIR.glob("*.yaml"))


def _as_profile(obj, name: str) -> DeviceProfile:
    """A plugin's profile: a DeviceProfile, a mapping of its keys, or a YAML file path."""
    if isinstance(obj, DeviceProfile):
        return obj
    if isinstance(obj, (str, Path)):
        return load_profile(str(obj))
    if isinstance(obj, dict):
        return DeviceProfile.model_validate({"name": name, **obj})
    raise TypeError(f"it is {obj!r}, not a DeviceProfile, a mapping or a profile path")


#: device profiles of plugins (a dotted path, or entry points of group ``simsparse.devices``);
#: the built-in ones are the files in ``profiles/``
DEVICES = Registry("device profile", "simsparse.devices", _as_profile,
                   "a simsparse.compute.devices.DeviceProfile, a mapping of its keys or a profile .yaml path",
                   builtins=builtin_profiles)
class ProfileError(ValueError):
    """A profile path that names a file which is not a device profile."""


#: a device profile is a few dozen lines
MAX_PROFILE_BYTES = 1_000_000


def load_profile(name_or_path: str, base_dir: Path | None = None) -> DeviceProfile:
    """A built-in profile by name (``p100``), a plugin's (a dotted path or an
    entry point name), or a YAML file path. An unknown name raises
    :class:`~simsparse.registry.UnknownName`."""
    p = Path(name_or_path)
    if is_dotted(name_or_path):
        return DEVICES[name_or_path]
    if not p.suffix:
        p = PROFILE_DIR / f"{name_or_path}.yaml"
        if not p.exists():
            return DEVICES[name_or_path]
    elif base_dir is not None and not p.is_absolute() and not p.exists():
        p = base_dir / p
    if not p.exists():
        raise FileNotFoundError(
            f"device profile {name_or_path!r} not found; built-in profiles: {builtin_profiles()}, or give a .yaml path"
        )
    data = _read_profile(p)
    if data.get("kind") == "machine":  # from `simsparse calibrate`: its compute part
        data = data.get("compute") or {}
        if not isinstance(data, dict):
            raise ProfileError(f"machine profile {p}: its 'compute' section is not a mapping of device keys")
    data.setdefault("name", p.stem)
    return DeviceProfile.model_validate(data)


def _read_profile(p: Path) -> dict:
    """A profile file's mapping; :class:`ProfileError` for a file that is not one."""
    allowed = ("allowed: a YAML mapping of device keys (mem_bandwidth_Bps, launch_s, peak_flops, kernels, ...) "
               "or a `simsparse calibrate` machine profile")
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_PROFILE_BYTES + 1)
        if len(raw) > MAX_PROFILE_BYTES:
            raise ProfileError(f"{p}: larger than {MAX_PROFILE_BYTES // 1000} kB, not a device profile; {allowed}")
        data = yaml_load(raw.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, YamlTooLarge, RecursionError, OSError) as e:
        why = "not valid YAML" if isinstance(e, yaml.YAMLError) else str(e) or type(e).__name__
        raise ProfileError(f"{p}: not a device profile ({why}); {allowed}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProfileError(f"{p}: is a YAML {type(data).__name__}, not a device profile; {allowed}")
    return data


def make_device(spec) -> Device:
    """``'ideal'``, a :class:`DeviceProfile`, or ``None`` (ideal)."""
    if spec is None or spec == "ideal":
        return IdealDevice()
    if isinstance(spec, DeviceProfile):
        return ParametricDevice(spec)
    raise TypeError(f"cannot make a device from {spec!r}")
