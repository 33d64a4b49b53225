"""The `pretrain` group's baselines (README.md in this folder): `full`, the classic warm-up over
the whole pool (the pre-training tax lipt cuts), and `none`, the untrained initial model. The
paper's method, `jigsaw`, is lipt.jigsaw."""

from lipt.warmup.strategy import FullWarmup, NoPretraining

__all__ = ["FullWarmup", "NoPretraining"]
