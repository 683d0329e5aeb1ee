"""`pcp launch`: the core's part of starting a run on a cluster engine (the run
directory, the secret, the files, submitting), the shell its launchers share, and the
launchers PCP ships: Slurm, MPI and Kubernetes."""
