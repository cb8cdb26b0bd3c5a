"""A training run as a whole: the job loop, the processes it launches, its run directory,
checkpoints, progress, report and plots, and how it ends."""
