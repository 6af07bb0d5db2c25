"""Analysis of pdbench run dirs: is pulling a conversation's KV cache faster than recomputing it?

``python -m analysis RUN_DIR [RUN_DIR...]`` (``__main__``) runs ``pipeline``:

- ``load``: the records as dataframes (corrupt files named, never counted ok);
- ``pairs``: requests paired across flows by (deployment, kind, history length,
  repetition, conversation, turn), averaged per repetition;
- ``stats``: intervals over repetitions (Rao-Wu cluster bootstrap, Student-t with
  Satterthwaite df, verdicts and the repetitions that would decide them);
- ``saving_curve`` + ``pull_recompute``: the crossover with its interval, the per-length
  savings, the A/A control; ``fits`` + ``predict`` + ``model_cost``: cost models and
  predicted crossovers; ``spent_cost``: the crossover predicted from what P spends (its
  TTFT split) per load; ``deployment``: all of it per deployment and per load
  (``Context``); ``policy``: policy.json, the answer for a router;
- ``questions/*``: one module per question (answer, tables, plots, summary), listed in
  ``registry``; ``answer`` (console, summary.json), ``plotting``, ``report`` (HTML) and
  ``wandb_report`` read the registry; ``plotkit`` and ``fmt`` are the shared leaves.

``whatif`` predicts a crossover from two rates (or a policy.json's calibrated ones);
``synthetic`` writes runs with a known answer and realistic noise (the calibration test's
source).
"""
