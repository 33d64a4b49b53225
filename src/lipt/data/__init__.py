"""Data: on-disk readers (sources), transforms and the Lightning DataModule."""

from lipt.data.datamodule import DataModule, IndexedImages
from lipt.data.sources import Splits, TensorImages

__all__ = ["DataModule", "IndexedImages", "Splits", "TensorImages"]
