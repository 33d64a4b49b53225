"""The rules across keys (lipt.run.rules) and the options that take no settings
(lipt.run.groups.check_no_settings), each branch on a composed config: a setting nothing would
read is refused in one line naming it and the fix, the shipped ways to set it pass."""

from __future__ import annotations

import pytest
import yaml
from hydra import compose, initialize_config_dir

from lipt.core.errors import UserError
from lipt.run.config import validate
from lipt.run.groups import check_no_settings
from tests.helpers import CONFIGS, FAST

# Every budget that trains the whole pool, with what it needs beside it.
WHOLE_POOL = [
    ["budget=lipt"],
    ["budget=infobatch", "pretrain=none"],
    ["budget=infobatch_soup"],
    ["budget=full", "pretrain=none"],
    ["budget=full", "selector=none", "pretrain=none"],
    ["budget=full_steps", "pretrain=none"],
    ["budget=full_schedule", "pretrain=none"],
    ["+approach=lipt_dynamic"],
    ["+approach=infobatch"],
]


def refusal(make_cfg, overrides: list[str], config_name: str = "train", deep: bool = False) -> str:
    with pytest.raises(UserError) as caught:
        validate(make_cfg(overrides, config_name=config_name), deep=deep, build=False)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("overrides", WHOLE_POOL, ids=lambda o: " ".join(o))
def test_reselect_every_on_the_whole_pool_is_refused(make_cfg, overrides):
    budget = validate(make_cfg(overrides), deep=False).budget.name  # fine without it
    message = refusal(make_cfg, [*overrides, "reselect_every=3"])
    for word in (f"budget={budget}", "whole pool", "reselect_every=3", "reselect_every=0"):
        assert word in message, message


@pytest.mark.parametrize(
    "overrides",
    [["selector=random", "pretrain=none"], ["budget=full", "pretrain=none"], []],
    ids=["subset", "whole-pool", "default"],
)
def test_reselect_every_on_a_saved_subset_is_refused(make_cfg, tmp_path, overrides):
    saved = tmp_path / "subset.npz"
    saved.write_bytes(b"")  # only its existence is checked before the rule
    args = [*overrides, f"subset_path={saved}"]
    validate(make_cfg(args), deep=False)  # fine without reselect_every
    message = refusal(make_cfg, [*args, "reselect_every=2"])
    assert "reselect_every=2" in message and "subset_path" in message, message


@pytest.mark.parametrize("stage", ["select", "pretrain"])
def test_reselect_every_in_another_stage_passes(make_cfg, stage):
    """train.py's key, in one list of overrides given to every stage of a pipeline."""
    validate(make_cfg(["reselect_every=2"], config_name=stage), deep=False)


@pytest.mark.parametrize(
    "overrides",
    [
        ["selector=random", "pretrain=none", "reselect_every=2"],
        ["selector=coverage", "reselect_every=1"],
        ["+approach=random_online"],  # its own reselect_every=2, of the default 15 epochs
        ["+approach=paper", "reselect_every=5"],
        ["budget=lipt", "reselect_every=0"],
    ],
    ids=lambda o: " ".join(o),
)
def test_reselect_every_on_a_subset_this_run_selects_passes(make_cfg, overrides):
    validate(make_cfg(overrides), deep=False)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["selector=coverage", "reselect_every=15"], ["reselect_every=15", "below 15"]),
        (["selector=coverage", "reselect_every=40"], ["trainer.max_epochs=15", "never"]),
        (
            ["+approach=random_online", "trainer.max_epochs=2"],
            ["reselect_every=2", "trainer.max_epochs=2", "below 2"],
        ),
        (["+approach=paper", "reselect_every=4", "trainer.max_epochs=4"], ["reselect_every=4"]),
        (
            ["selector=random", "pretrain=none", "reselect_every=1", "trainer.max_epochs=1"],
            ["trainer.max_epochs=1", "more trainer.max_epochs", "reselect_every=0"],
        ),
    ],
    ids=lambda o: " ".join(o) if isinstance(o, list) and "=" in o[0] else "",
)
def test_reselect_every_of_the_runs_epochs_or_more_is_refused(make_cfg, overrides, words):
    """Re-selection comes after every R epochs but not after the last: a period of the run's
    epochs or more never re-selects, and the run would train its first subset throughout."""
    message = refusal(make_cfg, overrides)
    for word in (*words, "never re-selected"):
        assert word in message, message
    shorter = [o for o in overrides if not o.startswith("trainer.max_epochs")]
    validate(make_cfg([*shorter, "trainer.max_epochs=41"]), deep=False)  # one epoch more


def test_an_experiments_period_too_long_for_the_run_names_its_protocol_key(make_cfg):
    """An experiment sets each approach's period through protocol.reselect_every.<approach>:
    shortened to 2 epochs, table 1's GraNd job is refused naming that key, which the command
    line can set (reselect_every itself, the experiment's interpolation, cannot be)."""
    job = ["+approach=grand_full", "+experiment=table1_cpu", "trainer.max_epochs=2"]
    message = refusal(make_cfg, job)
    assert message.startswith("protocol.reselect_every.grand_full=2 re-selects after every 2"), (
        message
    )
    validate(make_cfg([*job, "protocol.reselect_every.grand_full=1"]), deep=False)


def test_a_smoke_run_that_its_steps_end_keeps_its_reselect_every(make_cfg):
    """debug=fdr ends every fit after 2 steps (trainer.max_steps), in 1 epoch: a config that
    re-selects is seen through as it is, not refused for the smoke run's epochs."""
    validate(make_cfg(["debug=fdr", "selector=coverage", "reselect_every=5"]), deep=False)
    validate(make_cfg(["debug=fdr", "+approach=random_online"]), deep=False)


@pytest.mark.parametrize(
    "overrides",
    [
        ["optimized_metric=val_accuracy", "trainer.max_epochs=abc"],
        ["selector=random", "pretrain=none", "reselect_every=2", "trainer.max_epochs=abc"],
    ],
    ids=["optimized_metric", "reselect_every"],
)
def test_a_rule_that_reads_the_epochs_leaves_an_ill_typed_one_to_its_check(make_cfg, overrides):
    """The rules across the top level run before the trainer's keys are checked: a word for
    trainer.max_epochs is refused naming it, not int()'s traceback."""
    message = refusal(make_cfg, overrides, deep=True)
    assert message.startswith("trainer.max_epochs='abc' is invalid"), message


def targetless_options() -> list[tuple[str, str]]:
    """The options under configs/ that name no `_target_` once composed: nothing is called,
    so only their `name` label is read.

    Each option is composed into train once, several groups' options in one composition (the
    i-th option of every group): a group's node is the option the command line chooses for it,
    which wins over another option's `override /group` in its defaults (a selector's budget), so
    11 compositions (the largest group) read every option as composing each alone would."""
    options: dict[str, list[str]] = {}
    for path in sorted(CONFIGS.glob("*/*.yaml")):
        group, text = path.parent.name, path.read_text()
        if "@package _global_" in text or group in ("hydra", "logger", "callbacks"):
            continue
        options.setdefault(group, []).append(path.stem)
    found = []
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        for row in range(max(map(len, options.values()))):
            chosen = {group: names[row] for group, names in options.items() if row < len(names)}
            cfg = compose("train", overrides=[f"{g}={name}" for g, name in chosen.items()])
            for group, name in chosen.items():
                if group in cfg and "_target_" not in cfg[group]:
                    found.append((group, name))
    return sorted(found)


def test_the_targetless_options_are_the_none_ones():
    assert targetless_options() == [("clean", "none"), ("selector", "none")]
    for group in ("clean", "selector"):
        assert yaml.safe_load((CONFIGS / group / "none.yaml").read_text()) == {"name": "none"}


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("+clean.action=drop", ["clean.action=drop", "clean=none", "takes no settings"]),
        ("+clean.folds=3", ["clean.folds=3", "clean=none", "or drop it"]),
        ("+selector.balance=true", ["selector.balance=true", "selector=none"]),
        ("+selector.repeats=3", ["selector.repeats=3", "selector=none"]),
        ("+selector.bogus=1", ["selector.bogus=1", "selector=none"]),
    ],
)
def test_a_key_on_a_none_option_is_refused(make_cfg, override, words):
    message = refusal(make_cfg, [override], deep=True)
    for word in words:
        assert word in message, message


def test_a_none_option_keeps_its_name_and_the_other_options_their_keys(make_cfg):
    validate(make_cfg(["clean=none", "selector=none"]), build=False)
    validate(make_cfg(["clean=cleanlab", "clean.action=relabel"]), build=False)
    validate(make_cfg(["selector=random", "selector.balance=true"]), build=False)


def test_check_no_settings_names_the_option_or_the_group():
    check_no_settings("clean", {"name": "none"})
    check_no_settings("clean", {})
    with pytest.raises(UserError, match=r"^clean\.x=1 is ignored: clean=none takes"):
        check_no_settings("clean", {"name": "none", "x": 1})
    with pytest.raises(UserError, match=r"^clean\.x=\[1, 2\] is ignored: this clean takes"):
        check_no_settings("clean", {"x": [1, 2]})


# --- keys only some readers, stages or runs read ----------------------------------------------

NO_DEFAULT_DIR = ("dataset=cifar10", "dataset=imagenet")  # their data_dir is ??? (mandatory)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["+dataset.num_train=100"], "num_train=100"),
        (["+dataset.num_test=10"], "num_test=10"),
        (["+dataset.resize=64"], "resize=64"),
        (["dataset=cifar10", "+dataset.num_train=100"], "num_train=100"),
        (["dataset=cifar10", "+dataset.download=true"], "download=true"),
        (["dataset=synthetic", "+dataset.resize=16"], "resize=16"),
        (["dataset=imagenet", "+dataset.num_test=10"], "num_test=10"),
    ],
    ids=lambda o: o if isinstance(o, str) else " ".join(o),
)
def test_a_reader_key_the_reader_does_not_take_is_refused(make_cfg, tmp_path, overrides, key):
    data = [f"dataset.data_dir={tmp_path}"] if overrides[0] in NO_DEFAULT_DIR else []
    message = refusal(make_cfg, [*overrides, *data])
    name = key.partition("=")[0]
    assert message.startswith(f"dataset.{key} is ignored: dataset=") and f"no {name}" in message


def test_a_data_dir_beside_a_reader_without_files_is_refused(make_cfg, tmp_path):
    message = refusal(make_cfg, ["dataset=synthetic", f"dataset.data_dir={tmp_path}"])
    assert "dataset.data_dir=" in message and "make_synthetic) takes no data_dir" in message


@pytest.mark.parametrize("dataset", sorted(p.stem for p in (CONFIGS / "dataset").glob("*.yaml")))
def test_every_shipped_data_set_passes_with_its_reader_keys(make_cfg, tmp_path, dataset):
    node = yaml.safe_load((CONFIGS / "dataset" / f"{dataset}.yaml").read_text())
    data = [f"dataset.data_dir={tmp_path}"] if node["data_dir"] == "???" else []
    readers = {"imagenet": ["dataset.resize=300"], "synthetic": ["dataset.num_train=50"]}
    validate(make_cfg([f"dataset={dataset}", *data, *readers.get(dataset, [])]), deep=False)


@pytest.mark.parametrize(
    "overrides",
    [
        [],  # the shipped symmetric, seed 0 and pairs list
        ["dataset=cifar10", "dataset.data_dir={tmp}"],
        ["dataset.label_noise.rate=0.4", "dataset.label_noise.kind=pairs"],
        ["dataset.label_noise.rate=0.2", "dataset.label_noise.seed=5"],
        ["dataset.label_noise.pairs=[1,0,3,2,5,4,7,6,9,8]"],
        # at rate 0 the kind changes nothing, but a sweep of rates and kinds holds such a job
        ["dataset.label_noise.rate=0", "dataset.label_noise.kind=pairs"],
        ["+experiment=frontier_noisy", "+approach=infobatch", "dataset.label_noise.kind=pairs"],
    ],
    ids=lambda o: " ".join(o) or "default",
)
def test_label_noise_that_changes_labels_passes(make_cfg, tmp_path, overrides):
    validate(make_cfg([o.format(tmp=tmp_path) for o in overrides]), deep=False)


@pytest.fixture
def saved(tmp_path):
    """A subset file and a checkpoint file: only their existence is checked before the rules."""
    subset, ckpt = tmp_path / "subset.npz", tmp_path / "pretrain.ckpt"
    subset.write_bytes(b"")
    ckpt.write_bytes(b"")
    return {"subset": subset, "ckpt": ckpt}


@pytest.mark.parametrize(
    ("stage", "overrides", "words"),
    [
        ("train", ["selector=random", "+selector.repeats=3"], ["selector=random ranks with none"]),
        ("select", ["selector=random", "+selector.repeats=2"], ["selector=random ranks with none"]),
        ("select", ["selector=grand", "selector.repeats=3", "ckpt_path={ckpt}"], ["ckpt_path"]),
    ],
)
def test_selector_repeats_where_one_model_or_none_ranks_is_refused(
    make_cfg, saved, stage, overrides, words
):
    message = refusal(make_cfg, [o.format(**saved) for o in overrides], config_name=stage)
    assert message.startswith("selector.repeats="), message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    ("stage", "overrides"),
    [
        ("train", ["selector=grand", "selector.repeats=3"]),
        ("train", ["+approach=grand_full"]),
        ("select", ["selector=grand", "selector.repeats=3"]),
        ("select", ["selector=grand", "ckpt_path={ckpt}"]),
        ("train", ["selector=grand", "subset_path={subset}"]),  # the selector labels the run
        ("train", ["+approach=grand_full", "subset_path={subset}"]),  # select.py's overrides
        ("pretrain", ["selector=grand", "selector.repeats=3"]),  # shared with select.py's
        ("train", ["selector=random_balanced"]),
    ],
)
def test_selector_repeats_where_models_rank_passes(make_cfg, saved, stage, overrides):
    validate(make_cfg([o.format(**saved) for o in overrides], config_name=stage), deep=False)


@pytest.mark.parametrize("stage", ["select", "pretrain"])
def test_a_saved_subset_outside_train_py_is_refused(make_cfg, saved, stage):
    override = f"subset_path={saved['subset']}"
    message = refusal(make_cfg, [override], config_name=stage)
    assert message.startswith(f"{override} is main training's, which {stage}.py does not run")
    assert "drop subset_path" in message, message


def test_ckpt_path_in_pretrain_py_is_refused(make_cfg, saved):
    message = refusal(make_cfg, [f"ckpt_path={saved['ckpt']}"], config_name="pretrain")
    assert message.startswith(f"ckpt_path={saved['ckpt']} is ignored: pretrain.py resumes")


@pytest.mark.parametrize(
    ("stage", "overrides"),
    [
        ("train", ["subset_path={subset}", "selector=random"]),
        ("train", ["init_from=pretrained", "record_seen=true"]),
        ("select", ["ckpt_path={ckpt}"]),
        ("select", ["init_from=pretrained", "record_seen=true"]),  # train.py's, shared
        ("pretrain", ["init_from=pretrained", "record_seen=true"]),
    ],
)
def test_main_training_keys_where_they_are_read_pass(make_cfg, saved, stage, overrides):
    validate(make_cfg([o.format(**saved) for o in overrides], config_name=stage), deep=False)


@pytest.mark.parametrize("stage", ["train", "select"])
def test_pretrain_learners_outside_pretrain_py_is_refused(make_cfg, stage):
    message = refusal(make_cfg, ["pretrain.learners=[0,1]"], config_name=stage, deep=True)
    assert message.startswith("pretrain.learners=[0, 1] trains some learners in the jobs of")
    assert f"drop it for {stage}.py" in message, message


@pytest.mark.parametrize(
    ("stage", "overrides"),
    [
        ("train", ["pretrain.merge_from={tmp}", "pretrain.min_learners=2"]),  # budget=lipt
        ("train", ["selector=glister", "pretrain.num_threads=1"]),
        ("train", ["+approach=gradmatch_full"]),  # pretrain=full's kappa
        ("select", ["pretrain.num_threads=1", "pretrain.min_learners=2"]),
        ("pretrain", ["pretrain.learners=[0,1]", "pretrain.num_threads=1"]),
        ("train", ["budget=infobatch", "pretrain.learner_dir={tmp}"]),
        # pre-training's keys in one list of overrides with pretrain.py's: they pass
        ("select", ["ckpt_path={ckpt}", "pretrain.num_threads=1"]),
        ("train", ["budget=full", "pretrain.num_threads=1", "pretrain.min_learners=2"]),
    ],
)
def test_pretraining_keys_of_a_pipeline_pass(make_cfg, tmp_path, saved, stage, overrides):
    args = [o.format(tmp=tmp_path, **saved) for o in overrides]
    validate(make_cfg(args, config_name=stage), build=False)


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("+trainer.default_root_dir=/x", ["trainer.default_root_dir=/x", "hydra.run.dir"]),
        ("+trainer.logger=false", ["trainer.logger=false", "logger=none"]),
        ("+trainer.plugins=[]", ["trainer.plugins=[]", "atomic checkpoint"]),
        ("+trainer.enable_checkpointing=false", ["rolling last.ckpt", "ckpt_path=last"]),
        (  # the Trainer's own types would refuse a list of callbacks in pydantic's words
            "+trainer.callbacks=[{_target_: lightning.pytorch.callbacks.EarlyStopping, "
            "monitor: val/acc}]",
            ["trainer.callbacks=", "+callbacks.<name>._target_"],
        ),
        ("+trainer.callbacks=[]", ["trainer.callbacks=[]", "callbacks group"]),
    ],
)
def test_trainer_keys_lipt_sets_itself_are_refused(make_cfg, override, words):
    message = refusal(make_cfg, [override], deep=True)
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("trainer", ["default", "cpu", "gpu", "ddp"])
def test_the_shipped_trainers_pass(make_cfg, trainer):
    validate(make_cfg([f"trainer={trainer}"]), build=False)


def test_a_checkpoint_beside_a_selector_that_ranks_with_no_model_is_said_unread(
    make_cfg, saved, caplog
):
    """select.py selector=random ckpt_path=...: the checkpoint was never read, without a word.
    Not refused: a sweep of selectors ranking with one soup has random as its baseline."""
    import logging

    from lipt.stages import select as select_stage

    picks = [*FAST, "selector=random", f"ckpt_path={saved['ckpt']}"]
    with caplog.at_level(logging.WARNING):
        select_stage.run(validate(make_cfg(picks, config_name="select")))
    assert "ckpt_path is not read: selector=random ranks with no model" in caplog.text


def test_pretrain_py_without_pre_training_writes_the_initial_model(make_cfg):
    """pretrain.py pretrain=none (the common initial model, to rank with at init) was refused:
    budget=lipt scores epoch 0 with the jigsaw ensemble, a budget pretrain.py never spends."""
    validate(make_cfg(["pretrain=none"], config_name="pretrain"), build=False)
