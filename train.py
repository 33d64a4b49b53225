"""python train.py [overrides]: pre-train, select a subset, train on it, test (lipt.train.run)."""

from lipt.cli import train_main

if __name__ == "__main__":
    train_main()
