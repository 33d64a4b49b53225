"""The bounds most settings need, as `annotated_types` constraints (what pydantic checks):
``eta: Annotated[float, POSITIVE] = 0.1``. Any other range is an `Interval` at the annotation:
``Annotated[int, Interval(ge=1, le=64)]``. Pure Python: every room may annotate with these.
"""

from annotated_types import Ge, Gt, Interval

POSITIVE = Gt(0)
NON_NEGATIVE = Ge(0)
SHARE = Interval(gt=0, le=1)  # (0, 1]: a share of a whole, never nothing
UNIT = Interval(ge=0, le=1)  # [0, 1]
BELOW_ONE = Interval(ge=0, lt=1)  # [0, 1): a momentum, a drop ratio
OPEN_UNIT = Interval(gt=0, lt=1)  # (0, 1)
COUNT = Ge(1)  # a positive integer
SEED = Interval(ge=0, le=2**32 - 1)  # what numpy's generators take

__all__ = [
    "BELOW_ONE",
    "COUNT",
    "NON_NEGATIVE",
    "OPEN_UNIT",
    "POSITIVE",
    "SEED",
    "SHARE",
    "UNIT",
    "Interval",
]
