"""The backends: what drives rank programs and times them.

* :mod:`.driver` -- what both backends share: programs, streams, the request table;
* :mod:`.protocol` -- the MPI semantics every evaluator applies: eager, receive
  window, rendezvous round trip, posting order, the FIFO device;
* :mod:`.evaluators` -- the one table that decides how a point (and each of its
  helper collectives) is timed, and what the budget asks;
* :mod:`.events` -- the event engine driving the rank programs (the reference);
* :mod:`.fast` -- array evaluators that time recorded schedules for all ranks at once;
* :mod:`.real` -- mpi4py + torch: the same programs on real ranks.

Imports go downward only (``evaluators`` > ``events`` | ``fast`` | ``real`` >
``protocol`` > ``driver``); ``tests/experiments/test_import_contracts.py``
holds this.
"""
