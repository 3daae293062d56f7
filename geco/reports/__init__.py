"""Read-only views for admins and job owners: nothing here changes a job or the node.

A job as gecod contains it (``jobstatus``: ``geco status --job``), its story from the
journal (``journalview``: ``geco journal``), its granted resources (``rsrcinfo``), and the
node as ``geco check`` shows it (``nodeview``).
"""
