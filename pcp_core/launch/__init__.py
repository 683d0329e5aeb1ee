"""`pcp launch`: the core's part of starting a run on a cluster engine (the run
directory, the secret, the files, submitting), the shell both built-in launchers share,
and the two launchers PCP ships: Slurm and MPI."""
