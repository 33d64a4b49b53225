"""lipt on your own LightningModule and data set: jigsaw pre-training, subset selection with
re-selection, and dynamic pruning, on a small synthetic data set (about half a minute on a CPU).

    python examples/own_model.py
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import lipt


class Blobs(Dataset):
    """Your map-style data set: (input, class index) items. 8 classes of points in 32-d; the
    `split` "train" (2,000 points) and "test" (1,000) share the classes' centres."""

    def __init__(self, split: str = "train", classes: int = 8, dim: int = 32) -> None:
        g = torch.Generator().manual_seed(0)
        centres = torch.randn(classes, dim, generator=g) * 0.6
        y = torch.randint(0, classes, (3000,), generator=g)
        x = centres[y] + torch.randn(3000, dim, generator=g)
        part = slice(0, 2000) if split == "train" else slice(2000, 3000)
        self.x, self.y = x[part], y[part]

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.x[i], int(self.y[i])


def make_net() -> nn.Module:
    """Your model: any nn.Module whose final nn.Linear gives the logits (here `head`)."""
    net = nn.Sequential()
    net.add_module("body", nn.Sequential(nn.Linear(32, 64), nn.ReLU()))
    net.add_module("head", nn.Linear(64, 8))
    return net


class Model(L.LightningModule):
    """Your LightningModule. lipt's training batches are (x, y, idx, w): hand the per-sample
    losses and the weights to lipt.weighted_loss (it keeps the losses for dynamic pruning)."""

    def __init__(self, norm: str = "weights") -> None:
        super().__init__()
        self.net, self.norm = make_net(), norm
        self.last_losses: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        x, y, _, w = batch
        losses = F.cross_entropy(self(x), y, reduction="none")
        return lipt.weighted_loss(self, losses, w, norm=self.norm)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def accuracy(model: nn.Module, data: Blobs) -> float:
    with torch.no_grad():
        return float((model(data.x).argmax(1) == data.y).float().mean())


def trainer(epochs: int, callbacks: list) -> L.Trainer:
    return L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def main() -> None:
    L.seed_everything(0, verbose=False)
    train, test = Blobs("train"), Blobs("test")
    data = lipt.PoolDataModule(train, val_size=0.1, batch_size=64)

    # 1. Jigsaw pre-training of your model: 10 learners on disjoint shards, merged into a soup.
    soup = lipt.jigsaw_pretrain(make_net, data, batches_per_learner=1, local_epochs=5, head="head")
    print(f"soup: held-out {soup.report['soup_accuracy']:.3f} from {soup.samples} samples")

    # 2. A 20% subset ranked by the soup and its learners, re-selected every 2 epochs.
    subset = lipt.select(soup.model, data, 0.2, head="head", learner_heads=soup.learner_heads)
    data.set_subset(subset.indices, subset.weights)
    model = Model()
    trainer(6, [lipt.Reselection(2, data, 0.2, head="net.head")]).fit(model, datamodule=data)
    print(f"20% subset: {len(subset)} samples, test accuracy {accuracy(model, test):.3f}")

    # 3. Dynamic pruning at half the cost, epoch 0 scored by the soup's ensemble.
    data.set_subset(None)
    scores = lipt.ensemble_scores(soup.model, data, soup.learner_heads, head="head")
    pruning = lipt.DynamicPruning(lipt.LiptBudget(budget=0.5), data, initial_scores=scores)
    model = Model(norm="batch")  # dynamic pruning's weights restore the full epoch's loss sum
    trainer(6, [pruning]).fit(model, datamodule=data)
    shares = ", ".join(f"{share:.2f}" for share in pruning.pruned_share.values())
    print(f"dynamic pruning: pruned shares {shares}; test accuracy {accuracy(model, test):.3f}")


if __name__ == "__main__":
    main()
