"""python pretrain.py [overrides]: the pre-training stage alone (lipt.stages.pretrain.run)."""

from lipt.run.cli import pretrain_main

if __name__ == "__main__":
    pretrain_main()
