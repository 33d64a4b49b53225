"""lipt's SLURM launcher: Hydra loads a launcher only from the `hydra_plugins` namespace."""
