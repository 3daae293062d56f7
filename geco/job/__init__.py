"""A job's life on a node, from contain to end.

Three doors: the one way in (``containment``), the one way out (``ending``, with
``teardown``, ``strays``, ``gpufds``) and the undoing of a job that never ran here
(``undo``); its private /tmp (``privatetmp``) and its trace (``trace``).
What every wing says of a job (its key, resource set, accounting, GPU share) is on the
shared street below (:mod:`geco.jobkey`, :mod:`geco.resourceset`, ...).
"""
