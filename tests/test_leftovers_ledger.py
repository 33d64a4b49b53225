"""Dynamic pruning's ledger says what pruning saved: `samples_saved` counted every sample of
the whole pool's run that was not trained, the ones `trainer.limit_train_batches` (or
max_time) cut off included, as if pruning had saved them; those are `samples_cut` now."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from lipt.run.config import validate
from lipt.stages import train as train_stage
from tests.helpers import CONFIGS, FAST

POOL = 500  # the synthetic data set's pool


def _ledger(out: Path, extra: list[str]) -> tuple[dict, int]:
    """The run's stages.train.dynamic and the samples it trained."""
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"paths.output_dir={out}", *FAST, *extra])
    summary = train_stage.run(validate(cfg))
    return summary["stages"]["train"]["dynamic"], summary["stages"]["train"]["samples"]


def test_samples_cut_by_limit_train_batches_are_not_saved_by_pruning(tmp_path):
    # InfoBatch's 30% of a 10-epoch run: 4 epochs of the pool, pruned; 2 batches of each run
    ledger, samples = _ledger(
        tmp_path, ["fraction=0.3", "trainer.max_epochs=10", "+trainer.limit_train_batches=2"]
    )
    shares = ledger["pruned_share"]
    assert sorted(shares) == ["0", "1", "2", "3"] and shares["1"] > 0.05
    assert samples == 4 * 2 * 32  # batch_size=32: the stop cut every epoch short
    pruned = sum(round(share * POOL) for share in shares.values())
    # the 6 epochs the budget does not run, and the rows its plans left out; not the cut
    assert ledger["samples_saved"] == 6 * POOL + pruned, ledger
    assert ledger["samples_cut"] == 10 * POOL - ledger["samples_saved"] - samples > 1000
    assert ledger["samples_full"] == 10 * POOL


def test_a_run_that_trains_its_schedule_cut_nothing(tmp_path):
    ledger, samples = _ledger(tmp_path, ["budget.epochs=all", "trainer.max_epochs=3"])
    assert ledger["samples_cut"] == 0
    assert ledger["samples_saved"] == 3 * POOL - samples > 0  # what the plans left out


def test_the_samples_a_run_trained_are_counted_exactly_past_float32s_integers():
    """summary.json's samples (and the ledger's arithmetic on them): the count went through a
    float32 tensor, which holds every integer only up to 2**24, passed by ImageNet's pool of
    1.28M images in 14 epochs; 2**24 + 1 came back as 2**24."""
    import lightning as L
    from torch import nn

    from lipt.models.classifier import QUIET_TRAINER, Classifier

    module = Classifier(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), num_classes=2)
    module.trainer = L.Trainer(accelerator="cpu", devices=1, **QUIET_TRAINER)
    for seen in (2**24 + 1, 115_315_713):  # 90 epochs of ImageNet's 1,281,167, and one more
        module.samples_seen = seen
        assert module.total_samples_seen() == seen
