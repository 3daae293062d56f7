"""A job's GPUs on one node as its resource set writes them: the share grammar every wing reads.

A job's share on a node travels in its resource set's per-node GPU list (the seed's
``s#:`` field), in one of these forms:

* ``"1,3"``: ids, as Grid Engine granted them (RSMAP: UGE, Altair, OCS) or as mapped;
* ``"nvidia0,gpuB"``: Grid Engine's ids as granted, some not numbers: mapped once, where
  the node's table is known (the job's containment, :func:`geco.node.gpus.map_share`), and
  saved as ids in this node's resource file, so everything after (``GECO_GPUS``,
  ``CUDA_VISIBLE_DEVICES``, the journal) reads ids;
* ``"count:2"``: how many Grid Engine counted (Son of Grid Engine's INT consumable).
  :func:`geco.node.gpus.pick` chooses the ids under the node lock, among the GPUs no other
  running job holds, nearest the job's cores first, and they are saved beside the count in
  this node's resource file (``"count:2=1,3"``), so the picture is rebuilt from the running
  jobs' files after any restart, and in a record beside that file, from which a file
  written anew from Grid Engine gets them back (:mod:`geco.sge.gpupicks`). A new
  containment of the job (its cgroups were gone) picks again: ids it held before may be
  another job's by then.

The node's GPUs themselves, and how Grid Engine's ids name them, are :mod:`geco.node.gpus`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from geco._tuple import NamedTuple
from geco.errors import GecoError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from geco.config import Config

__all__ = ["COUNT_PREFIX", "GpuComplex", "Share", "format_ids", "from_hgr", "parse_share"]

COUNT_PREFIX = "count:"
_NUMBER = re.compile(r"[0-9]+")
# an INT consumable's amount as OCS puts it in SGE_HGR_<name> ("2.000000"): a count, no id
_AMOUNT = re.compile(r"[0-9]+\.[0-9]+")


class GpuComplex(NamedTuple):
    """The Grid Engine complex that grants GPUs (``[gpu] complex`` and ``consumable``).

    Attributes
    ----------
    name: the complex (an RSMAP, or Son of Grid Engine's INT consumable).
    per: ``slot`` (consumable YES: the request x the job's slots on a node) or ``job``
        (consumable JOB: the request, booked on the master node).
    """

    name: str = "gpu"
    per: str = "slot"

    @classmethod
    def from_config(cls, cfg: Config) -> GpuComplex:
        """The complex the configuration names."""
        return cls(cfg.gpu_complex, cfg.gpu_consumable)


class Share(NamedTuple):
    """A job's GPUs on one node, as its resource set's GPU list says them.

    Attributes
    ----------
    amount: how many.
    ids: which (``()`` while a count is not picked yet, or Grid Engine's ids not mapped).
    counted: Grid Engine only counted them (geco picks the ids, anew at each containment);
        False: Grid Engine granted the ids themselves (an RSMAP).
    names: Grid Engine's ids as granted when some are not numbers, in its order, each once
        (:func:`map_share` turns them into ``ids``); ``()`` otherwise.
    """

    amount: int = 0
    ids: tuple[int, ...] = ()
    counted: bool = False
    names: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.names:
            return ",".join(self.names)
        if not self.counted:
            return format_ids(self.ids)
        return f"{COUNT_PREFIX}{self.amount}" + (f"={format_ids(self.ids)}" if self.ids else "")


def parse_share(text: str) -> Share:
    """A node record's GPU list.

    ``""`` -> none; ``"count:2"`` -> 2 counted; ``"count:2=1,3"`` -> 2 counted, picked as 1
    and 3; ``"1,3"`` or ``"1 3"`` (Grid Engine's ``SGE_HGR_<name>`` separates with spaces)
    -> ids 1 and 3 granted; ``"nvidia0,gpuB"`` -> Grid Engine's ids, to be mapped
    (:func:`map_share`). An id listed twice is one GPU.

    Raises
    ------
    GecoError
        when a count or the ids picked for it are not whole numbers (the error names it).
    """
    text = text.strip()
    if not text:
        return Share()
    if text.startswith(COUNT_PREFIX):
        count, _, listed = text[len(COUNT_PREFIX):].partition("=")
        if not _NUMBER.fullmatch(count):
            raise GecoError(f"a GPU count must be a whole number, got {text!r}")
        picked = listed.replace(",", " ").split()
        if not all(_NUMBER.fullmatch(i) for i in picked):
            raise GecoError(f"a GPU list must be ids in PCI bus order such as 0,1, got {text!r}")
        return Share(int(count), tuple(sorted({int(i) for i in picked})), True)
    words = tuple(dict.fromkeys(text.replace(",", " ").split()))
    if all(_NUMBER.fullmatch(w) for w in words):
        ids = tuple(sorted({int(w) for w in words}))
        return Share(len(ids), ids)
    return Share(len(words), names=words)


def from_hgr(value: str) -> str:
    """A GPU list from ``SGE_HGR_<complex>`` in a job's spooled environment: Grid Engine's
    ids there, separated by spaces (``"0 1"``, ``"nvidia0"``); "" for an INT consumable's
    amount (OCS writes ``"2.000000"``): how many is no id, and geco does not guess."""
    words = value.split()
    return "" if len(words) == 1 and _AMOUNT.fullmatch(words[0]) else ",".join(words)


def format_ids(ids: Iterable[int]) -> str:
    """Ids as the resource set and ``GECO_GPUS`` write them: ``"1,3"``."""
    return ",".join(str(i) for i in sorted(ids))
