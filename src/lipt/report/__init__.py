"""What a person reads after runs: a sweep's tables, plots and paired differences
(`python -m lipt.report.sweep`, `make report`), the table printed at the end of a multirun, and
a run's pictures (subset.png, wandb media)."""
