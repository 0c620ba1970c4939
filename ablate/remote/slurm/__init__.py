"""Slurm's side on the cluster: the batch adapter's decisions and a job's time arithmetic."""
