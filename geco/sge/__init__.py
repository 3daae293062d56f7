"""Everything geco reads from or asks of Grid Engine, in one place.

* :mod:`geco.sge.execd`: what a hook or gecod learns on the node itself: the
  job's ids, its execd spool dir (``config``, ``environment``, ``pid``) and its
  ``sge_shepherd``;
* :mod:`geco.sge.pe_hostfile`: the spooled list of the job's hosts and slots;
* :mod:`geco.sge.qstat`: the one ``qstat -xml -j`` per job, and its parsing;
  :mod:`geco.sge.requests` reads the job's requests from it (Son of Grid Engine's
  and Univa's one list, Open Cluster Scheduler's request set per scope), with
  ``geco.sge._xml``'s value readers;
* :mod:`geco.sge.siteenv`: the site's Grid Engine environment for the
  commands root runs (never the job's);
* :mod:`geco.sge.v1format` and :mod:`geco.sge.resourcefile`: the job's
  resource set as the ``GECOResourceSet_v1{...}`` text, and the resource file
  ``<state_dir>/resources/<job>.<task>`` that holds it;
* :mod:`geco.sge.lookup`: the one way every component gets a job's resource
  set (the resource file, else qstat, else the spool), and where it came from;
* :mod:`geco.sge.jobinstance`: which job of its number a job is (its cluster and
  submission time, from the spool), since Grid Engine reuses job numbers.

Nothing here imports another part of geco that touches cgroups: the package is
what geco knows about Grid Engine, and only that.
"""
