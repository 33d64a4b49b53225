"""LiPT's jigsaw pre-training (README.md in this folder: the method, its knobs, the paper's
numbers). The stage is lipt.jigsaw.stage; nothing is imported here, so checking a config
(lipt.jigsaw.checks) or using the pure soups does not import Lightning."""
