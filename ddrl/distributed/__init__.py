"""Distribution: world discovery (MPI, Slurm) and gradient synchronisation backends."""
