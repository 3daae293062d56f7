"""The wire between the preload, gecod, users and other hosts.

The wire format (``frame``, ``messages``, ``replay``, ``reader``), the
peer-credentialed client (``client``), the master's side of a parallel job's
barrier (``cluster``), who may reach a port (``address``) and the keys that
sign frames (``keys``).
"""
