"""ssh into a compute node: who may come in and which job a session joins.

``policy``: pam_slurm_adopt's rules in Grid Engine's terms (root and admins, a job's
owner, the job a session joins); ``pamstack``: what the node's PAM stack does with
them, for ``geco check``.
"""
