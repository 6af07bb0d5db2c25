"""The deployment job on one task of the allocation (loaded there only, by
``jobs.entry.deployment``): ``task`` (who this task is, its servers, the rendezvous),
``loop`` (task 0: the router and the Points), ``point`` (one Point measured), ``flags``
(what a Point's logs and counters say is wrong: pure), ``rendezvous``, ``servers``,
``warm_up``, ``next_points`` and ``state`` (what a running task holds)."""
