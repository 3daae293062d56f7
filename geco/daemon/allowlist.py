"""Who may connect to the cluster channel at all: the cluster's own hosts.

Anyone on the network can reach gecod's cluster port; nothing they send is
believed without the cluster key, but each connection costs gecod a slot until
its deadline. So a connection from a host that is not one of the cluster's is
closed at accept, before a byte is read. The cluster's hosts are:

* ``[cluster] allow`` when it names any: host names, addresses, networks;
* else Grid Engine's execution hosts (``qconf -sel``), the hosts a parallel job's
  master and slaves are among. Re-read every :data:`REFRESH` seconds, on SIGHUP,
  and when a host that is not on the list connects (at most every :data:`RETRY`
  seconds: a host just added to the cluster gets in within a minute); kept in
  ``<state_dir>/cluster-hosts`` so that a gecod started while the qmaster is down
  still knows them. Until a list is known, nobody is let in (fail closed).

Loopback is always let in: it is this host, whose users can use its own address
anyway. Names are resolved in a thread of the list's own, never at accept.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Iterable

from geco import log
from geco.atomicfile import write_atomic
from geco.config import Config
from geco.errors import GecoError

__all__ = ["REFRESH", "RETRY", "AllowList"]

_log = log.get("daemon.allowlist")

REFRESH = 600.0
RETRY = 60.0
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _addresses(name: str) -> set[str]:
    """Every address ``name`` resolves to (none when it does not)."""
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(name, None)}
    except (OSError, UnicodeError):
        return set()


def resolve(entries: Iterable[str]) -> tuple[frozenset[str], tuple[_Network, ...]]:
    """Host names, addresses and networks as (addresses, networks)."""
    found: set[str] = set()
    networks: list[_Network] = []
    for entry in entries:
        try:
            net = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            found |= _addresses(entry)
            continue
        if net.num_addresses == 1:
            found.add(str(net.network_address))
        else:
            networks.append(net)
    return frozenset(found), tuple(networks)


class AllowList:
    """The cluster channel's allow-list (see the module docstring).

    Parameters
    ----------
    cfg: ``[cluster] allow``, ``state_dir``, and what ``qconf`` needs.
    """

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.source = ("[cluster] allow" if cfg.cluster_allow
                       else "Grid Engine's execution hosts (qconf -sel)")
        self._addresses: frozenset[str] | None = None
        self._networks: tuple[_Network, ...] = ()
        self._why_none = "the list is being read"
        self._read_at = 0.0
        self._wake = threading.Event()
        self._urgent = False  # an admin asked (SIGHUP): no RETRY wait
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresher, name="gecod-cluster-hosts",
                                        daemon=True)
        self._kept = cfg.state_dir / "cluster-hosts"
        if not cfg.cluster_allow:
            self._load_kept()

    def start(self) -> None:
        """Read the list now and then every :data:`REFRESH` s, in a thread of its own."""
        self._thread.start()

    def reload(self, cfg: Config) -> None:
        """Read the list again now, with ``cfg``'s ``[cluster] allow`` (gecod's SIGHUP)."""
        self.cfg = cfg
        self.source = ("[cluster] allow" if cfg.cluster_allow
                       else "Grid Engine's execution hosts (qconf -sel)")
        self._urgent = True
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def admits(self, host: str) -> str:
        """"" when the address ``host`` may connect, else one sentence why not (from the
        loop: nothing here waits)."""
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return f"{host} is not an address"
        if address.is_loopback:
            return ""
        known = self._addresses
        if known is None:
            return (f"the cluster's hosts are not known yet ({self._why_none}): nobody is "
                    "let in until they are")
        if host in known or any(address in net for net in self._networks):
            return ""
        if time.monotonic() - self._read_at >= RETRY:
            self._wake.set()  # a host just added to the cluster gets in at the next read
        return f"{host} is not one of the cluster's hosts ({self.source})"

    # -- reading the list ------------------------------------------------------------

    def _refresher(self) -> None:
        while not self._stop.is_set():
            self._read()
            self._wake.wait(REFRESH)
            self._wake.clear()
            if self._urgent:
                self._urgent = False
                continue
            # a miss wakes us at once, but never more often than every RETRY seconds: a
            # stranger knocking cannot make every node ask the qmaster
            self._stop.wait(max(0.0, self._read_at + RETRY - time.monotonic()))

    def _read(self) -> None:
        self._read_at = time.monotonic()
        if self.cfg.cluster_allow:
            self._addresses, self._networks = resolve(self.cfg.cluster_allow)
            return
        from geco.sge import command

        try:
            names = command.run_qconf(["-sel"], self.cfg).split()
        except GecoError as exc:
            self._why_none = str(exc)
            if self._addresses is None:
                _log.warning("the cluster channel lets no host in yet: %s", exc,
                             extra=log.job_fields(None, None, "cluster-hosts-unknown",
                                                  REASON=str(exc)))
            else:
                _log.warning("cannot read the cluster's hosts again (%s); keeping the %d "
                             "addresses read before", exc, len(self._addresses))
            return
        addresses, _ = resolve(names)
        if addresses != self._addresses:
            _log.info("the cluster channel lets in %d execution hosts (%d addresses)",
                      len(names), len(addresses),
                      extra=log.job_fields(None, None, "cluster-hosts", HOSTS=len(names),
                                           ADDRESSES=len(addresses)))
            self._keep(addresses)
        self._addresses = addresses

    def _keep(self, addresses: frozenset[str]) -> None:
        try:
            write_atomic(self._kept, "".join(f"{a}\n" for a in sorted(addresses)).encode(),
                         mode=0o644, make_dir=True, what="the cluster's hosts")
        except GecoError as exc:  # read again from qconf after a restart
            _log.debug("%s", exc)

    def _load_kept(self) -> None:
        try:
            text = self._kept.read_text(encoding="ascii", errors="replace")
        except OSError:
            return
        found = set()
        for line in text.split():
            try:
                found.add(str(ipaddress.ip_address(line)))
            except ValueError:
                continue
        if found:
            self._addresses = frozenset(found)
