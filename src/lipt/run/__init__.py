"""What every run stands on. The build layer, which alone reads the composed config: the entry
points (cli), the config turned into typed settings (config: `Run`, checked with checks, groups
and preflight) and the Hydra callbacks (hydra_callbacks). Then a run's group nodes turned into
objects (build), and the support the stages and methods share: one-line user errors, seeds,
atomic files, the console, the run-folder lock; and the generator of docs/CONFIG.md. The package
itself imports nothing, so the pure selectors and the generator take single modules from it
without the rest."""
