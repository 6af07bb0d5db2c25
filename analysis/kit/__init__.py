"""Leaves every stage may use: number formatting (``fmt``) and the figure scaffold
(``plotkit``)."""
