"""The class names of the data sets lipt reads, in label order: what pictures label their
classes with (lipt.report.pictures). CIFAR's come from its own `meta` file when it is there."""

from __future__ import annotations

import pickle
from pathlib import Path

FASHION_MNIST = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]

CIFAR10 = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]

# CIFAR-100's fine labels (its meta file's `fine_label_names`, alphabetical).
CIFAR100 = (  # noqa: SIM905 (a list literal of 100 names is no easier to read)
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus "
    "butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach "
    "couch crab crocodile cup dinosaur dolphin elephant flatfish forest fox girl hamster "
    "house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree "
    "motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear "
    "pickup_truck pine_tree plain plate poppy porcupine possum rabbit raccoon ray road "
    "rocket rose sea seal shark shrew skunk skyscraper snail snake spider squirrel streetcar "
    "sunflower sweet_pepper table tank telephone television tiger tractor train trout tulip "
    "turtle wardrobe whale willow_tree wolf woman worm"
).split()


def cifar_names(base: Path, num_classes: int) -> list[str]:
    """The names in CIFAR's meta file beside its batches (`batches.meta`, `meta`), else the
    published ones."""
    if num_classes == 10:
        meta, key, known = "batches.meta", "label_names", CIFAR10
    else:
        meta, key, known = "meta", "fine_label_names", CIFAR100
    try:
        with open(base / meta, "rb") as f:
            names = [str(n) for n in pickle.load(f, encoding="latin1")[key]]
    except (OSError, EOFError, pickle.UnpicklingError, KeyError, TypeError, ValueError):
        return list(known)
    return names if len(names) == num_classes else list(known)
