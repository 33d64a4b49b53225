"""lipt on a SLURM cluster: `hydra/launcher=slurm` (launcher.py: the jigsaw learners as a job
array, then the jobs; finished jobs skipped; one line for a cancelled or failed job), the
learners' array tasks (learners.py), main training's answer to the time-limit signal
(requeue.py), and what is asked of SLURM before anything is submitted (slurm.py).
docs/SLURM.md."""
