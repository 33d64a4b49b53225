"""lipt's Hydra plugins: Hydra loads a sweeper only from the `hydra_plugins` namespace."""
