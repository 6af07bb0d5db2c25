"""Tools for testing the analysis, not shipped with it: synthetic runs with a known answer
and realistic noise (``synthetic``), the calibration check of the statistics (``calibration``),
the noise figures of real runs (``roughness``) and the planted-crossover search simulation
(``crossover_sim``). Tests and benchmarks import them; no shipped package does."""
