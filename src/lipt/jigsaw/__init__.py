"""LiPT's jigsaw pre-training (README.md in this folder: the method, its knobs, the paper's
numbers). The method is lipt.jigsaw.strategy (`pretrain=jigsaw`); nothing is imported here,
so checking a config (lipt.run) or using the pure soups does not import Lightning."""

# How greedy_interp_soup searches a candidate's ratio grid: "grid" scores every alpha, "scan"
# scores them from the smallest up and stops at the first drop. Here, not in soup.py, so that
# checking a config does not import torch.
SEARCHES = ("grid", "scan")
