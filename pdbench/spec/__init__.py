"""The only builder of what runs (pure): launch specs, server commands, sbatch text,
containers, the vLLM entry point and UCX transport names."""
