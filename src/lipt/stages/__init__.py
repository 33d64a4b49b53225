"""The pipeline's stages, in order: pretrain (stage 1), select (stage 2), train (stage 3), each a
`run(run)` that the entry scripts call with the run's typed settings (lipt.stages.run.Run);
results (what they hand each other), what they write (summary.json, the pre-training outputs),
and main training's callbacks (re-selection, the seen-samples audit). The methods themselves
live beside: lipt.jigsaw, lipt.selection, lipt.dynamic."""
