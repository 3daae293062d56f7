"""What admins and job owners are shown: views of a job and of the node.

A job as gecod contains it (``jobstatus``: ``geco status --job``), its story from the
journal (``journalview``: ``geco journal``), its granted resources (``rsrcinfo``), the
node and the doors out of a job as ``geco check`` shows them (``nodeview``, ``doors``),
and what keeps geco on the node (``removal``: ``geco uninstall-check``, which the
package's prerm asks; the one that acts, removing geco's own empty cgroups once gecod
has stopped). Nothing else here changes a job or the node.
"""
