"""The event engine: every rank program driven message by message.

:mod:`.sim` holds the ranks, their contexts and the request handlers;
:mod:`.messages` MPI matching, starts and completions; :mod:`.cpu` the host
cores ranks may share; :mod:`.model` a training model's forward and backward
on each rank's device; :mod:`.memo` kernels run once for identical inputs.

It may import :mod:`..driver`, :mod:`..protocol` and the layers below the
backends, never :mod:`..fast` or :mod:`..real`: the helper collectives it
gathers are timed by whatever :mod:`..evaluators` hands it.
"""
