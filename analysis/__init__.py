"""Analysis of pdbench run dirs: is pulling a conversation's KV cache faster than recomputing it?

``python -m analysis RUN_DIR [RUN_DIR...]`` (``__main__``) runs ``pipeline`` through four
stages, each a package importing only the ones below it (``pyproject.toml``'s contract):

- ``load``: the records read into their types (``records``), then frames (corrupt files
  named, never counted ok);
- ``method``: requests paired across flows, intervals over repetitions (Rao-Wu cluster
  bootstrap, Student-t with Satterthwaite df), the crossover with its interval and the A/A
  control, cost models and predicted crossovers, all of it per deployment and load;
- ``questions``: one module per question on ``question``'s base (answer, tables, plots,
  summary), listed in ``registry``;
- ``output``: the terminal answer and summary.json, plots, the HTML report, W&B and
  policy.json (the answer for a router).

``kit`` holds the leaves every stage may use (formatting, the figure scaffold). ``whatif``
predicts a crossover from two rates (or a policy.json's calibrated ones). Synthetic runs,
the calibration check and noise figures live in ``testbed`` (not shipped).
"""
