"""One training job across several daemons: data-parallel learners on torch.distributed.

``steps``: the pure maths of a job's update (how many SGD steps the ranks agree on, one
buffer per step carrying each rank's row-weighted gradient, the union's observation moments),
no process group. ``job``: the process group itself (rendezvous at ``cluster.master``, served
by rank 0's TCPStore; the collectives the learner calls). Nothing here is imported while
``cluster.world_size`` is 1: a daemon alone never loads torch.distributed.
"""
