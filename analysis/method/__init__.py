"""Stage 2: the method. Requests paired across flows (``pairs``, ``paired_cells``),
intervals over repetitions (``stats``), the crossover and the A/A control
(``saving_curve``, ``pull_recompute``), cost models (``fits``, ``predict``, ``model_cost``,
``spent_cost``, ``samples``), families of deployments (``compare``) and all of it per
deployment and load (``deployment``)."""
