"""python pretrain.py [overrides]: the pre-training stage alone (lipt.pretrain.run)."""

from lipt.cli import pretrain_main

if __name__ == "__main__":
    pretrain_main()
