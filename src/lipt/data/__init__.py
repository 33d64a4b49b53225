"""Data: on-disk readers (sources), transforms, lipt's Lightning DataModule and `PoolDataModule`,
your own map-style data set as lipt's pool."""

from lipt.data.contract import LearnerData, SubsetData, check_labelled
from lipt.data.datamodule import DataModule, IndexedImages
from lipt.data.pool import PoolDataModule
from lipt.data.sources import Splits, TensorImages

__all__ = [
    "DataModule",
    "IndexedImages",
    "LearnerData",
    "PoolDataModule",
    "Splits",
    "SubsetData",
    "TensorImages",
    "check_labelled",
]
