"""What every run stands on: the entry points and the config checks before a stage starts (cli,
config, checks, preflight), config nodes turned into objects (build), and the support the stages
and methods share: one-line user errors, seeds, atomic files, the console, the run-folder lock;
and the generator of docs/CONFIG.md. The package itself imports nothing, so the pure selectors
and the generator take single modules from it without the rest."""
