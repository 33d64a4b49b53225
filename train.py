"""python train.py [overrides]: pre-train, select a subset, train on it, test
(lipt.stages.train.run)."""

from lipt.run.cli import train_main

if __name__ == "__main__":
    train_main()
