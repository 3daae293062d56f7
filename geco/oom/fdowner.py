"""An object that owns one fd the runloop polls (the kernel log, a job's OOM notifier)."""

from __future__ import annotations

import os
from typing import Self

__all__ = ["FdOwner"]


class FdOwner:
    """Owns ``self._fd`` (-1 once closed): :meth:`fileno` for the runloop, :meth:`close`,
    and ``with`` to close it."""

    _fd: int

    def fileno(self) -> int:
        """The fd the runloop polls for reading."""
        return self._fd

    def close(self) -> None:
        """Close the fd (remove it from the runloop first); closing twice is harmless."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
