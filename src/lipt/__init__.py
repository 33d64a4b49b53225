"""lipt: cheap pre-training for gradient-based subset training (Lightning + Hydra).

Implements "Lowering the Pre-training Tax for Gradient-based Subset Training: A Lightweight
Distributed Pre-Training Toolkit" (Ro et al., ICML 2023, https://proceedings.mlr.press/v202/ro23a.html).
"""

__version__ = "0.1.0"
