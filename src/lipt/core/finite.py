"""The one scan for NaN and infinite values, by rows and chunk by chunk, which the data's
checks, the selectors' and label cleaning's share. Here, below data/ and selection/, so that
every layer above imports the same scan."""

from __future__ import annotations

import torch
from torch import Tensor

# Rows checked at a time: a bounded bool buffer on a large tensor (a pool's [N, D] embeddings,
# a data set's images), not one the size of the tensor.
CHUNK_ROWS = 4096


def nonfinite_rows(values: Tensor) -> Tensor:
    """[K] int64 on the CPU, ascending: the rows of `values` [N, ...] holding a NaN or an
    infinity (none for an integer tensor, a scalar or no rows)."""
    floating = values.is_floating_point() or values.is_complex()
    if not floating or values.ndim == 0 or values.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64)
    finite = torch.cat(
        [chunk.reshape(len(chunk), -1).isfinite().all(1) for chunk in values.split(CHUNK_ROWS)]
    )  # [N]
    return torch.nonzero(~finite).flatten().cpu()
