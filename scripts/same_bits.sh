#!/usr/bin/env bash
# Does a change leave what lipt trains bit for bit? Runs five frontier jobs at seed 0 (the
# reference, and lipt_dynamic, coverage, infobatch and full_schedule at 10%) on the commit
# REV and on the working tree, then compares each job's summary numbers, subset (its rows and
# weights) and trained weights. Needs Fashion-MNIST (make data); 11 minutes on two cores.
#   bash scripts/same_bits.sh REV [OUT]   (OUT: where the two sweeps go, default /tmp/same_bits)
set -euo pipefail
rev=${1:?usage: scripts/same_bits.sh REV [OUT]}
out=${2:-/tmp/same_bits}
here=$(git rev-parse --show-toplevel)
python=$here/.venv/bin/python
data=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
rm -rf "$out" && mkdir -p "$out"
git -C "$here" worktree add -q --detach "$out/code" "$rev"
trap 'git -C "$here" worktree remove --force "$out/code"' EXIT

sweep() {  # $1: code root, $2: sweep folder
  (cd "$1" && PYTHONPATH="$1/src" "$python" train.py -m +experiment=frontier_cpu \
    '+approach=lipt_dynamic,coverage,infobatch,full_schedule' fraction=0.1 seed=0 \
    hydra/launcher=joblib hydra.launcher.n_jobs=2 "dataset.data_dir=$data" \
    "hydra.sweep.dir=$2" hydra.sweep.subdir='${approach}')
}
sweep "$out/code" "$out/before"
sweep "$here" "$out/after"

"$python" - "$out/before" "$out/after" <<'EOF'
import hashlib, json, sys
from pathlib import Path

import numpy as np
import torch


def subset_digest(path: Path) -> str:
    """The subset's rows and weights: its metadata may record more keys and still select the
    same rows."""
    with np.load(path, allow_pickle=False) as data:
        rows = data["indices"].tobytes() + data["weights"].tobytes()
    return hashlib.sha256(rows).hexdigest()[:16]


def digest(job: Path) -> dict:
    summary = json.loads((job / "summary.json").read_text())
    state = torch.load(job / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    weights = hashlib.sha256()
    for name, tensor in sorted(state["state_dict"].items()):
        weights.update(name.encode() + tensor.numpy().tobytes())
    subset = job / "subset.npz"
    return {
        "test_accuracy": summary["test_accuracy"],
        "val_accuracy": summary.get("val_accuracy"),
        "samples": summary["stages"]["train"]["samples"],
        "weights": weights.hexdigest()[:16],
        "subset": subset_digest(subset) if subset.exists() else "",
    }


before, after = Path(sys.argv[1]), Path(sys.argv[2])
jobs = sorted(p.name for p in before.iterdir() if (p / "summary.json").is_file())
assert len(jobs) == 5, jobs
differ = []
for job in jobs:
    a, b = digest(before / job), digest(after / job)
    print(f"{job:14} {'same' if a == b else 'DIFFERENT'}  {a}")
    if a != b:
        print(f"{'':14} now {b}")
        differ.append(job)
print("bit for bit" if not differ else f"changed: {', '.join(differ)}")
sys.exit(1 if differ else 0)
EOF
