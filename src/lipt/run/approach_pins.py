"""What an approach pins, held against a sweep's command line: `+approach=infobatch` names a
method by the group options its config file pins, and the frontier sweeper gives its reference
job every override but the methods' points. A choice on the command line that would replace a
pinned one (its runs trained as another method under the approach's name), and a method's own
setting the reference job's config has no key for, are refused in one line. Called by
lipt.run.precheck inside Hydra's context, on the overrides lipt.run.sweep_overrides expands.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from lipt.core.errors import UserError
from lipt.run.composition import compose_jobs
from lipt.run.declared_sweep import DeclaredSweep
from lipt.run.frontier_sweep import as_reference, key_of, setting_of
from lipt.run.sweep_overrides import candidate_overrides

# The group whose options are the frontier's and the experiments' methods (configs/approach).
APPROACH = "approach"


def check_approach_choices(args: list[str], params: list[str], declared: DeclaredSweep) -> None:
    """An approach names a method by the group options it pins (`+approach=infobatch`:
    pretrain=none, budget=infobatch); a choice on the command line replaces the pinned one
    (Hydra's command line wins), and the runs would train another method under the
    approach's name, in its rows of every report: refused in a line, for every job, a frontier's
    reference jobs too (they take every override but the point keys). Inside Hydra's context
    (check_sweeps), `args` and `params` as it expands them."""
    from hydra.core.global_hydra import GlobalHydra

    if not declared.config_name:
        return
    jobs = [(job, False) for job in candidate_overrides(args, params)]
    if declared.multirun and declared.reference:
        reference, points = declared.reference, declared.point_keys
        jobs += [(as_reference(job, reference, points), True) for job, _ in jobs]
    chosen = [
        (dict(setting_of(o) for o in job if not o.startswith("~") and "=" in o), is_reference)
        for job, is_reference in jobs
    ]
    if not any(APPROACH in settings for settings, _ in chosen):
        return
    hydra = GlobalHydra.instance().hydra
    assert hydra is not None
    searchpath = [a for a in args if a.startswith("hydra.searchpath=")]
    repo = hydra.config_loader._parse_overrides_and_create_caching_repo(  # type: ignore[attr-defined]
        declared.config_name, searchpath
    )[1]
    pins: dict[str, dict[str, str]] = {}
    # The stage's own `override group: option` (select.py: selector=coverage) comes before an
    # approach's in Hydra's defaults tree, and Hydra keeps a group's first override.
    stage = stage_pins(repo, declared.config_name)
    for settings, is_reference in chosen:
        approach = settings.get(APPROACH)
        if approach is None:
            continue
        if approach not in pins:
            pins[approach] = pinned_choices(repo, f"{APPROACH}/{approach}")
        for group, pinned in pins[approach].items():
            other = settings.get(group)
            if other is None and stage.get(group, pinned) != pinned:
                raise UserError(
                    f"{declared.config_name}.py chooses {group}={stage[group]} ahead of "
                    f"+{APPROACH}={approach}'s {group}={pinned} (Hydra keeps a group's first "
                    f"override): its runs would select with {stage[group]} under the name "
                    f"{approach}; add {group}={pinned}"
                )
            if other is None or other == pinned:
                continue
            whose = (
                f"the frontier's reference job (+{APPROACH}={approach}), which takes every "
                "override but hydra.sweeper.point_keys, pins"
                if is_reference
                else f"+{APPROACH}={approach} pins"
            )
            raise UserError(
                f"{group}={other} replaces the {group} that {whose} ({group}={pinned}), and "
                f"Hydra's command line wins: its runs would train another method under the "
                f"name {approach}; drop {group}={other}, or make that method an approach of its "
                f"own (docs/METHODS.md)"
            )


def stage_pins(repo: Any, config_name: str) -> dict[str, str]:
    """The group options a stage's primary config (select.yaml) chooses with `override group:
    option` in its own defaults list."""
    from hydra.core.default_element import GroupDefault

    loaded = repo.load_config(config_name)
    elements = [] if loaded is None else loaded.defaults_list or []
    return {
        str(e.group).lstrip("/"): e.value
        for e in elements
        if isinstance(e, GroupDefault) and e.override and isinstance(e.value, str)
    }


def pinned_choices(repo: Any, path: str) -> dict[str, str]:
    """The group options the config file at `path` (in Hydra's repository `repo`) pins with
    `override /group: option`, the configs it includes from its own group followed."""
    import posixpath

    from hydra.core.default_element import ConfigDefault, GroupDefault

    loaded = repo.load_config(path)
    if loaded is None:
        return {}
    pinned: dict[str, str] = {}
    for element in loaded.defaults_list or []:
        if isinstance(element, ConfigDefault) and element.path not in (None, "_self_"):
            base = posixpath.dirname(path)
            pinned.update(pinned_choices(repo, posixpath.join(base, str(element.path))))
        elif isinstance(element, GroupDefault) and element.override:
            value, group = element.value, str(element.group)
            if isinstance(value, str) and group.startswith("/"):
                pinned[group.lstrip("/")] = value
    return pinned


def check_reference_takes(args: list[str], params: list[str], declared: DeclaredSweep) -> None:
    """The frontier sweeper gives its reference job every override but the methods' points: one
    the reference's config has no key for, though a method's has (a method's own setting, as
    `selector.class_tilt=0.3` beside `+approach=coverage`), would end the sweep in Hydra's
    "Could not override", which names neither the reference nor a way out: refused in a line
    that does. Inside Hydra's context (check_sweeps), `args` and `params` as it expands them."""
    if not (declared.multirun and declared.reference and declared.config_name):
        return
    from hydra import compose
    from hydra.errors import ConfigCompositionException

    kept = [
        a
        for a in args
        if a.startswith("hydra.searchpath=") or not a.startswith(("hydra.", "hydra/"))
    ]
    from hydra.core.global_hydra import GlobalHydra

    hydra = GlobalHydra.instance().hydra
    assert hydra is not None
    loader = hydra.config_loader
    groups: dict[str, bool] = {}

    def signature(o: str) -> str:
        """What Hydra's "Could not override" depends on: a group's choice, a value's key."""
        key = key_of(o)
        if key not in groups:
            groups[key] = bool(loader.get_group_options(key))
        return o if groups[key] else o.split("=", 1)[0]

    reference, points = declared.reference, declared.point_keys
    composed: set[tuple[str, ...]] = set()
    for candidate in candidate_overrides(kept, params):
        job = as_reference(candidate, reference, points)
        if (shape := tuple(signature(o) for o in job)) in composed:
            continue
        composed.add(shape)
        try:
            compose(declared.config_name, job, return_hydra_config=False)
            continue
        except ConfigCompositionException as e:
            named = re.search(r"'([^']+)'", str(e))
            key = named.group(1) if named else None
            has = "already has" if "already" in str(e) else "has no"  # +key=: Hydra appends only
        override = next((o for o in job[len(reference) :] if key_of(o) == key), None)
        if override is None:
            return  # not an override of the methods': the precheck says what Hydra says
        try:
            compose(declared.config_name, candidate, return_hydra_config=False)
        except ConfigCompositionException as e:
            if f"'{key}'" in str(e):
                return  # no method takes it either: Hydra's own refusal names it
        fix_keys = ",".join([*(key_of(k) for k in points), str(key)])
        raise UserError(
            f"{override} reaches the frontier's reference job too ({' '.join(reference)}: the "
            f"sweeper gives it every override outside hydra.sweeper.point_keys), whose config "
            f"{has} {key}; set a method's own keys in its approach's config file "
            f"(docs/METHODS.md), or keep this one off the reference: "
            f"'hydra.sweeper.point_keys=[{fix_keys}]'"
        )


def job_refusal(
    message: str,
    job: list[str],
    jobs: list[list[str]],
    declared: DeclaredSweep,
    groups: set[str],
    elsewhere: Callable[[list[str]], bool],
) -> str:
    """The line refusing one job of a sweep (`message`, the refusal's own line), naming the job
    where the command line does not: a frontier's reference job, which takes overrides the user
    gave for the methods (`reselect_every=3` beside `+approach=paper` reached `budget=full`), or
    a job whose swept group choice has no key an override sets or refuses its value
    (`selector.balance=false` beside a swept `+approach`, one of them without a selector), where
    a job with other choices takes it (`elsewhere(job)`). `jobs`: the sweep's jobs; `groups`:
    the keys among theirs that choose a config group's option (swept_groups)."""
    if declared.multirun and declared.is_reference(job):
        return reference_refusal(message, job, declared.reference, declared.point_keys)
    swept = [o for o in swept_choices(job, jobs) if key_of(o) in groups]
    missing = re.match(r"Could not override '([^']+)'", message)
    given = [o for o in job if o not in swept and key_of(o) not in groups]
    if missing:
        named = [o for o in given if key_of(o) == missing[1]]
    else:
        named = [o for o in given if re.search(rf"(?<![\w.]){re.escape(o)}(?![\w.])", message)]
    if not swept or not named or not elsewhere(job):
        return message
    what = f"has no {key_of(named[0])}" if missing else f"refuses it: {message.split('; ')[0]}"
    return (
        f"{named[0]} reaches every job of the sweep, and the one with {' '.join(swept)} {what}; "
        f"sweep only the options that take it, or set it in the config file of each that does "
        f"(docs/METHODS.md)"
    )


def accepted_elsewhere(
    config_name: str, jobs: list[list[str]], groups: set[str]
) -> Callable[[list[str]], bool]:
    """Whether a job of `jobs` with other group choices than a given job's composes and
    passes the run's first checks (lipt.run.config.validate, deep=False): where none does, a
    refusal is the override's own, not one job's."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from lipt.run.config import validate

    def accepted(job: list[str]) -> bool:
        def choices(j: list[str]) -> set[str]:
            return {o for o in j if key_of(o) in groups}

        tried = [choices(job)]
        for other in jobs:
            if choices(other) in tried:
                continue
            tried.append(choices(other))
            composed = compose_jobs(config_name, [other])
            try:
                validate(next(composed), deep=False)
                return True
            except (HydraException, OmegaConfBaseException, UserError):
                continue
            finally:
                composed.close()
        return False

    return accepted


def reference_refusal(message: str, job: list[str], reference: list[str], points: list[str]) -> str:
    """A frontier's reference job refused: the overrides of the user's that reached it and
    that the refusal names (their keys in `message`), and how to keep them off it."""
    given = job[len(reference) :]
    named = [o for o in given if re.search(rf"(?<![\w.]){re.escape(key_of(o))}\b", message)]
    cause = message.split("; ", 1)[0]  # lipt's refusals: what is wrong; how to fix it
    where = (
        f"the frontier's reference job ({' '.join(reference)}: the sweeper gives it every "
        "override outside hydra.sweeper.point_keys)"
    )
    if not named:
        return f"{where} is refused: {message}"
    keys = [key_of(o) for o in named]
    fix_keys = ",".join(dict.fromkeys([*(key_of(k) for k in points), *keys]))
    return (
        f"{' '.join(named)} reaches {where}, which refuses it: {cause}; keep it off the "
        f"reference: 'hydra.sweeper.point_keys=[{fix_keys}]'"
    )


def swept_choices(job: list[str], jobs: list[list[str]]) -> list[str]:
    """The overrides of `job` whose key takes more than one value across `jobs`."""
    values: dict[str, set[str]] = {}
    for each in jobs:
        for o in each:
            values.setdefault(key_of(o), set()).add(o)
    return [o for o in job if len(values.get(key_of(o), ())) > 1]


def swept_groups(args: list[str], params: list[str]) -> set[str]:
    """The keys of a sweep's overrides that choose a config group's option (`approach`), as
    Hydra's config loader knows the groups. Inside Hydra's context (check_sweeps)."""
    from hydra.core.global_hydra import GlobalHydra

    hydra = GlobalHydra.instance().hydra
    assert hydra is not None
    keys = {key_of(o) for job in candidate_overrides(args, params) for o in job}
    return {key for key in keys if hydra.config_loader.get_group_options(key)}
