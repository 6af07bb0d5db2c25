"""Analysis of pdbench run dirs: is pulling a conversation's KV cache faster than recomputing it?

``python -m analysis RUN_DIR [RUN_DIR...]`` (``__main__``) runs ``pipeline``: ``load``
(dataframes) -> ``samples`` + ``fits`` + ``model_cost`` -> ``crossover`` -> ``answer``,
``plots``, ``report`` (HTML) and, when asked, ``wandb_report``. ``whatif`` predicts a
crossover from two rates; ``synthetic`` writes a run dir with a known answer.
"""
