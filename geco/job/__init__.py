"""A job's life on a node, from contain to end.

Its identity (``jobkey``), its resource set and how it is shown (``resourceset``,
``rsrcinfo``), the one way in (``containment``) and the one way out (``ending``, with
``teardown``, ``strays``, ``gpufds``, ``accounting``), and its story (``trace``,
``jobstatus``, ``journalview``).
"""
