"""The node's resources that jobs are given.

Cores and their topology (``cores``, ``topology``: hwloc through cffi), GPUs
(``gpus``), and the node as ``geco check`` shows it (``nodeview``).
"""
