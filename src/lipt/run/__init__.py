"""The entry layer, on top: the only code that reads Hydra's composed config. The entry points
(cli; precheck, the command line checked before Hydra starts), the config turned into typed
settings (config: `Run`, checked with groups, rules and preflight), the Hydra callbacks
(hydra_callbacks, frontier_sweep) and the generator of docs/CONFIG.md. Nothing below imports it."""
