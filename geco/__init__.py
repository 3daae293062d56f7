"""geco: the Grid Engine Cgroup Orchestrator.

Per-job cgroups (whole cores bound to the job's slots, memory limits, nothing
left behind) for Grid Engine, set up by prolog/starter/epilog hooks and by gecod,
the node daemon that quarantines each job's processes at their exec().
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
