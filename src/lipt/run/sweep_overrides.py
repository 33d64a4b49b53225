"""What a command line sweeps, read as Hydra reads it: every value of a swept key, and every job
of the sweep (up to CHECKED_JOBS), the config's declared sweep (lipt.run.declared_sweep)
included, for lipt.run.precheck to compose and check. A sweep Hydra would refuse or run as no
job is refused in one line: a sweep outside a multirun, a sweep of Hydra's own settings, a
glob() of a key that is no group or that matches no option, an empty range, an interval() for
the basic sweeper. Under --cfg, which Hydra composes as a single run, a sweep is refused as
outside a multirun. (lipt.run.approach_pins holds the same expanded sweep against what each
approach pins.)
"""

from __future__ import annotations

from typing import Any

from lipt.core.errors import UserError
from lipt.run.declared_sweep import SWEEPER_PARAMS, DeclaredSweep


def candidate_overrides(args: list[str], declared: list[str]) -> list[list[str]]:
    """Override lists to compose: sweeps (`a=1,2`) are expanded value by value, so a bad choice
    anywhere in a multirun is caught before any job starts. `declared`: the config's own
    `hydra.sweeper.params` (an experiment's approaches, fractions and seeds). As in Hydra's
    BasicSweeper they come first, then `args`; a repeated key keeps its first place and takes
    its last value (so `+approach=...` precedes `+experiment=...`, as in the jobs)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    by_key: dict[str, list[str]] = {}
    for o in OverridesParser.create().parse_overrides([*declared, *args]):
        key = o.get_key_element()
        if o.is_interval_sweep():  # an Optuna search's interval(a, b): both of its ends
            interval = o.value()
            by_key[key] = [f"{key}={interval.start}", f"{key}={interval.end}"]  # type: ignore[union-attr]
        elif o.is_sweep_override():
            by_key[key] = [f"{key}={value}" for value in o.sweep_string_iterator()]
        else:
            by_key[key] = [str(o.input_line)]
    by_key = {key: values for key, values in by_key.items() if values}
    firsts = {key: values[0] for key, values in by_key.items()}
    candidates = [list(firsts.values())]
    for key, values in by_key.items():
        candidates += [[*{**firsts, key: value}.values()] for value in values[1:]]
    return candidates


def check_sweeps(args: list[str], declared: DeclaredSweep) -> tuple[list[str], list[str]]:
    """`args` and the declared params with each glob() of a group's options spelled out as
    Hydra's sweeper will run it (the options it matches, listed); a sweep Hydra would refuse,
    or run as no job, refused in a line: a sweep outside a multirun, a sweep of Hydra's own
    settings, a glob() of a key that is no group or that matches no option, an empty range, an
    interval() for Hydra's basic sweeper. Inside Hydra's context (its config loader)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType

    hydra = GlobalHydra.instance().hydra
    assert hydra is not None
    loader = hydra.config_loader
    parser = OverridesParser.create(config_loader=loader)

    def explicit(lines: list[str]) -> list[str]:
        out = []
        for line, o in zip(lines, parser.parse_overrides(lines), strict=True):
            if not o.is_sweep_override():
                out.append(line)
                continue
            key = o.get_key_element()
            if o.is_hydra_override():
                raise UserError(
                    f"{line}: Hydra does not sweep its own settings (hydra.*); give one value"
                    + sweeper_param_fix(o, declared)
                )
            if o.value_type == ValueType.GLOB_CHOICE_SWEEP:
                group = o.key_or_group
                options = loader.get_group_options(group)
                if not options:
                    raise UserError(
                        f"{line}: glob() sweeps the options of a config group, and {group} is "
                        f"not a group; list the values instead ({group}=a,b)"
                    )
                values = list(o.sweep_string_iterator())
                if not values:
                    raise UserError(
                        f"{line} matches none of {group}'s options ({', '.join(options)})"
                    )
                line = f"{key}={','.join(values)}"  # the jobs Hydra's sweeper makes of it
            elif o.is_interval_sweep():
                low, high = o.value().start, o.value().end  # type: ignore[union-attr]
                if low is not None and high is not None and low > high:
                    raise UserError(
                        f"{line}: an interval goes from its low end to its high end; give "
                        f"interval({high}, {low})"
                    )
                if not declared.multirun:
                    fix = "add -m with a sweeper that samples it (e.g. hparams_search=lr_wd), or "
                    raise UserError(
                        f"{line} is a search interval: "
                        + declared.one_job_fix(fix + "give one value")
                    )
                if declared.basic:
                    raise UserError(
                        f"{line}: Hydra's basic sweeper runs listed values, not an interval; "
                        f"give {key}=a,b or range(), or search with hparams_search=lr_wd"
                    )
                out.append(line)
                continue
            else:
                values = list(o.sweep_string_iterator())
                if not values:
                    raise UserError(f"{line} sweeps no values, so Hydra would run no job")
            if not declared.multirun:
                n = f"{len(values)} value{'s' if len(values) != 1 else ''}"
                as_list = f" (a list is {key}=[{line.split('=', 1)[1]}])"
                fix = declared.one_job_fix("add -m to run a job for each, or give one value")
                # a group's [a,b] merges both options into one: no list of values
                is_group = bool(loader.get_group_options(o.key_or_group))
                raise UserError(
                    f"{o.input_line} sweeps {n}: {fix}"
                    + (
                        as_list
                        if o.value_type == ValueType.SIMPLE_CHOICE_SWEEP and not is_group
                        else ""
                    )
                )
            out.append(line)
        return out

    return explicit(args), explicit(declared.params)


def sweeper_param_fix(o: Any, declared: DeclaredSweep) -> str:
    """For a sweep of `hydra.sweeper.params.<key>` (Hydra refuses any sweep of its settings):
    quoted, it is the one string the sweeper reads, where the config declares params (a dotted
    key is refused before: misread_sweeper_params); without params, the override it meant."""
    param = o.key_or_group.removeprefix(SWEEPER_PARAMS + ".")
    if param == o.key_or_group:
        return ""
    values = str(o.input_line).split("=", 1)[1]
    assert declared.composed is not None
    if declared.composed.hydra.sweeper.get("params") is None:
        return f"; sweep it as an override instead: -m {param}={values}"
    return f"; to declare a sweep there, quote it: {o.get_key_element()}='{values}'"


# precheck composes every job of a sweep up to this many; past it, every value of each swept
# key. A job costs about 10 ms (each choice of groups is composed once, ~0.1 s): a tenth of
# Hydra's own composition of the job when it runs.
CHECKED_JOBS = 10_000


def every_job(args: list[str], declared: list[str]) -> list[list[str]]:
    """Every combination of a sweep's values (as Hydra's BasicSweeper makes the jobs)."""
    import itertools

    candidates = candidate_overrides(args, declared)
    by_key: dict[str, list[str]] = {}
    for candidate in candidates:
        for override in candidate:
            key = override.split("=", 1)[0]
            by_key.setdefault(key, [])
            if override not in by_key[key]:
                by_key[key].append(override)
    size = 1
    for values in by_key.values():
        size *= len(values)
    if size > CHECKED_JOBS:
        return candidates
    return [list(job) for job in itertools.product(*by_key.values())]
