"""Array evaluators: a recorded schedule timed for all ranks at once.

:mod:`.bulk` records what a helper collective does on every rank (waves of
messages and kernels); :mod:`.timing` times it as arrays, exactly, or
replays it (:mod:`.replay_ab`, :mod:`.replay_arrays`), or times it wave after
wave, approximately (:mod:`.waves_ab`, :mod:`.waves_flow`); :mod:`.rounds`
times a whole value-free dense allreduce as lockstep rounds. The compiled
ones book the alpha-beta ports on arrays (:mod:`.ports`).

It may import :mod:`..driver`, :mod:`..protocol` and the layers below the
backends, never :mod:`..events` or :mod:`..real`.
"""
