"""The BLAS/OpenMP threads of a sampler's ask (surrogate fit, screening, annealing).

numpy's BLAS starts one thread per core and spins while it waits. In the main job the asks
run beside training, on a thread of a process whose cores torch already uses, so those
threads only fight torch's and slow both (docs/samplers.md has the measurement). Each ask
therefore runs under a ``threadpoolctl`` limit, one thread unless the sampler is given more.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from contextlib import nullcontext
from typing import Any

from threadpoolctl import ThreadpoolController


class AskThreads:
    """Limits the thread pools (BLAS, OpenMP) loaded in the process to ``threads`` while an
    ask runs. OpenMP's limit holds for the asking thread only; BLAS's for the process, so
    numpy elsewhere in the process runs with it for the duration of the ask."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._controller: ThreadpoolController | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"threads": self.threads}  # another process finds its own libraries

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["threads"])  # type: ignore[misc]

    def limit(self) -> AbstractContextManager[Any]:
        if self._controller is None:
            # Found once: scanning the loaded libraries costs about 1 ms.
            self._controller = ThreadpoolController()
        if not self._controller.lib_controllers:
            return nullcontext()
        return self._controller.limit(limits=self.threads)
