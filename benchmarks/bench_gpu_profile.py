"""A device profile's roofline against a GPU's measured layers and top-k.

    python benchmarks/bench_gpu_profile.py [CALIBRATED.yaml] [--profile h100]

CALIBRATED (default docs/calibrations/h100_2r.yaml) is a profile written by
``simsparse calibrate --device cuda``: per model, the forward time and the time
at which each gradient was ready on the GPU (CUDA events), and every kernel of
the real backend fitted. For each model it holds, this prints the measured
forward + backward beside what ``--profile``'s roofline predicts at the same
batch size (``compute.models.model_profile``), and the top-k kernel by both.
Which rows are calibration and which are held out is the profile's business:
h100's efficiency is derived from resnet50_imagenet, so that row is not a
prediction.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    from simsparse.compute.devices import ParametricDevice, load_profile
    from simsparse.compute.models import model_profile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calibrated", nargs="?", default=str(REPO / "docs/calibrations/h100_2r.yaml"))
    ap.add_argument("--profile", default="h100", help="the profile whose roofline is compared (default h100)")
    args = ap.parse_args(argv)
    meas, prof = load_profile(args.calibrated), load_profile(args.profile)
    print(f"measured: {meas.source}\nroofline: {args.profile} (peak {prof.peak_flops:.3g} FLOP/s x "
          f"{prof.compute_efficiency:g}, {prof.mem_bandwidth_Bps:.3g} B/s, {prof.launch_s * 1e6:.2f} us per op)\n")
    print(f"{'model':20s} {'batch':>5s} {'measured fwd/bwd ms':>20s} {'roofline fwd/bwd ms':>20s} {'error':>7s}")
    for name, mt in meas.models.items():
        mp = model_profile(name, mt.batch_size, prof)
        tm, tp = sum(mt.t_fwd) + sum(mt.t_bwd), mp.t_forward + mp.t_backward
        print(f"{name:20s} {mt.batch_size:5d} {sum(mt.t_fwd) * 1e3:9.2f}/{sum(mt.t_bwd) * 1e3:<9.2f} "
              f"{mp.t_forward * 1e3:9.2f}/{mp.t_backward * 1e3:<9.2f} {tp / tm - 1:+7.0%}")
    dm, dp = ParametricDevice(meas), ParametricDevice(prof)
    print(f"\n{'top-k of n float32':20s} {'measured ms':>12s} {'profile ms':>12s}")
    for n in (3e4, 3e5, 3e6, 1.2e7):
        tm, tp = (float(d.cost_array("topk", [n], [4 * n])[0]) for d in (dm, dp))
        print(f"{n:20.3g} {tm * 1e3:12.3f} {tp * 1e3:12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
