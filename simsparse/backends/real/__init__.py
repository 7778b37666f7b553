"""The real backend: the same rank programs under ``mpiexec`` with mpi4py and torch.

:mod:`.mpi` drives them; :mod:`.wire` serialises payloads; :mod:`.start`
gives every rank one common start; :mod:`.rank_env` the environment each
rank starts with.

It may import :mod:`..driver` and :mod:`..protocol`, never :mod:`..events`
or :mod:`..fast`.
"""
