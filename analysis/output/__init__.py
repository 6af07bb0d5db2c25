"""Stage 4: what the answers become: the terminal answer and summary.json (``answer``), the
plots (``plotting``), the HTML report (``report``), W&B (``wandb_report``) and policy.json
(``policy``)."""
