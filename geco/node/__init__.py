"""The node's resources that jobs are given.

Cores and their topology (``cores``, ``topology``: hwloc through cffi), GPUs
(``gpus``), the rules that turn a job's grant into its limits (``limits``) and the node's
health (``health``).
"""
