"""One module per question the analysis answers (``analysis/question.py`` says what a
question holds; ``analysis/registry.py`` lists them)."""
