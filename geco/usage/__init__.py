"""What a job used: gecod's sampler, the samples it keeps per job, and their readings.

The sampler (``sampler``) reads each job's counters once a round; its samples go to the
job's file (``samples``) and its figures to Prometheus (``exposition``). A job's
efficiency beside its request (``efficiency``, the one home of seff's ratios) and its
pictures (``usagechart`` in the terminal, ``usageplot`` to a file) read them back.
"""
