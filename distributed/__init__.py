"""What only dist_train.py needs: the cluster from flags, TF_CONFIG or Slurm, the
local-cluster launcher, the ps tasks' shutdown, the workers' sessions and updates.

Importing the package imports nothing else: take the modules by name.
"""
