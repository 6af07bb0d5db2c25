"""One module per question the analysis answers (``analysis/questions/question.py`` says what a
question holds; ``analysis/questions/registry.py`` lists them)."""
