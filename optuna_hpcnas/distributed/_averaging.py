"""Averaging the supernet's shared weights between evaluation groups, without a parameter
server and without stopping the groups.

Each group leader sends the change of its weights since the last agreed average through a
hierarchical all-reduce: a reduce among the leaders of one node, an all-reduce among one
leader per node, a broadcast back inside the node. The three steps are non-blocking MPI
collectives advanced by ``poll`` between training steps, so a group never waits for a slower
one to finish its candidate; the result is applied on top of whatever the group trained in
the meantime (``w = w + mean_delta - own_delta``). ``compression="powersgd"`` sends a rank-r
factorisation of every matrix (``P = M Q``, then ``Q = M^T P``, as in Vogels et al. 2019 and
torch's PowerSGD hook) with error feedback; bytes sent are counted either way.
"""

from __future__ import annotations

from collections.abc import Generator
from collections.abc import Sequence
import logging
import time
from typing import Any
from typing import TYPE_CHECKING

import numpy as np

from optuna_hpcnas._validation import check_int

if TYPE_CHECKING:
    import torch

    from optuna_hpcnas.distributed._groups import EvaluationGroup

_logger = logging.getLogger(__name__)
COMPRESSIONS = ("none", "powersgd")


class _HierarchicalSum:
    """One non-blocking hierarchical sum of ``buf`` (float32) over all group leaders."""

    def __init__(self, group: EvaluationGroup, buf: np.ndarray) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self._node = group.node_leaders
        self._cross = group.cross_node
        self._buf = np.ascontiguousarray(buf, dtype=np.float32)
        self._tmp = np.empty_like(self._buf)
        self._phase = 0
        self._req: Any = None
        self.bytes_sent = 0
        self._advance()

    def _advance(self) -> None:
        """Post the next phase whose predecessor finished (phase 0 posts the reduce)."""
        MPI = self._mpi
        while True:
            if self._req is not None:
                if not self._req.Test():
                    return
                self._req = None
                if self._phase == 1:
                    self._buf, self._tmp = self._tmp, self._buf
            if self._phase == 0:
                self._phase = 1
                if self._node.Get_size() > 1:
                    self._req = self._node.Ireduce(
                        self._buf,
                        self._tmp if self._node.Get_rank() == 0 else None,
                        op=MPI.SUM,
                        root=0,
                    )
                    if self._node.Get_rank() != 0:
                        self.bytes_sent += self._buf.nbytes
                else:
                    self._tmp[...] = self._buf
                continue
            if self._phase == 1:
                self._phase = 2
                if self._cross is not None and self._cross.Get_size() > 1:
                    self._req = self._cross.Iallreduce(MPI.IN_PLACE, self._buf, op=MPI.SUM)
                    # a ring all-reduce sends about 2 (n - 1) / n buffers per rank
                    n = self._cross.Get_size()
                    self.bytes_sent += int(2 * (n - 1) / n * self._buf.nbytes)
                continue
            if self._phase == 2:
                self._phase = 3
                if self._node.Get_size() > 1:
                    self._req = self._node.Ibcast(self._buf, root=0)
                    if self._node.Get_rank() == 0:
                        self.bytes_sent += self._buf.nbytes
                continue
            return

    def test(self) -> bool:
        self._advance()
        return self._phase == 3 and self._req is None

    @property
    def result(self) -> np.ndarray:
        return self._buf


class ParameterAverager:
    """Asynchronous hierarchical averaging of shared tensors between group leaders.

    Collective over the leaders: every leader creates one with the same tensors (same
    shapes, same order) and calls ``maybe_start``/``poll``/``finish``; other ranks do not.

    Args:
        group: This rank's ``EvaluationGroup`` (must be a leader).
        tensors: The shared floating-point tensors (parameters and float buffers), CPU.
        interval: Start a round after every ``interval`` trials this group finishes.
        compression: ``"none"`` or ``"powersgd"``.
        powersgd_rank: Rank of the PowerSGD factorisation.
        seed: Seed of PowerSGD's initial ``Q`` (identical on every leader).
    """

    def __init__(
        self,
        group: EvaluationGroup,
        tensors: Sequence[torch.Tensor],
        *,
        interval: int = 1,
        compression: str = "none",
        powersgd_rank: int = 4,
        seed: int = 0,
    ) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(
                f"`compression` is {compression!r}, but must be one of {list(COMPRESSIONS)}."
            )
        check_int("interval", interval, 1)
        if not group.is_leader:
            raise ValueError("Only group leaders average weights; this rank is not one.")
        self._group = group
        self._tensors = list(tensors)
        self._interval = interval
        self._compression = compression
        self._rank = powersgd_rank
        self._rng = np.random.default_rng(seed)
        self._num_leaders = int(group.leaders.Get_size())
        self._base = self._flat()
        self._error = np.zeros_like(self._base)
        self._round: Generator[np.ndarray, np.ndarray, None] | None = None
        self._op: _HierarchicalSum | None = None
        self._trials_since = 0
        self.rounds_started = 0
        self.rounds_done = 0
        self.bytes_sent = 0
        self.bytes_uncompressed = 0

    @property
    def enabled(self) -> bool:
        return self._num_leaders > 1

    def _flat(self) -> np.ndarray:
        if not self._tensors:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(
            [t.detach().cpu().reshape(-1).float().numpy() for t in self._tensors]
        ).astype(np.float32, copy=True)

    def _add_to_tensors(self, change: np.ndarray) -> None:
        import torch

        offset = 0
        with torch.no_grad():
            for t in self._tensors:
                n = t.numel()
                piece = torch.from_numpy(change[offset : offset + n]).view_as(t)
                t.add_(piece.to(device=t.device, dtype=t.dtype))
                offset += n

    def _matrix_slices(self) -> list[tuple[int, int, int]]:
        """(offset, rows, cols) of every tensor PowerSGD factorises (2-D and larger)."""
        out = []
        offset = 0
        for t in self._tensors:
            n = t.numel()
            if t.dim() >= 2 and min(t.shape[0], n // t.shape[0]) > self._rank:
                out.append((offset, int(t.shape[0]), n // int(t.shape[0])))
            offset += n
        return out

    def _round_gen(self) -> Generator[np.ndarray, np.ndarray, None]:
        snapshot = self._flat()
        delta = snapshot - self._base + self._error
        self.bytes_uncompressed += delta.nbytes
        n = float(self._num_leaders)
        if self._compression == "none":
            total = yield delta
            mean = total / n
            approx = delta
        else:
            mats = self._matrix_slices()
            in_mat = np.zeros(delta.shape, dtype=bool)
            qs = []
            ps = []
            for off, rows, cols in mats:
                in_mat[off : off + rows * cols] = True
                m = delta[off : off + rows * cols].reshape(rows, cols)
                q = self._rng.standard_normal((cols, self._rank)).astype(np.float32)
                qs.append(q)
                ps.append(m @ q)
            p_sum = yield (
                np.concatenate([p.ravel() for p in ps]) if ps else np.zeros(0, np.float32)
            )
            p_hat = []
            offset = 0
            for (_, rows, _), p in zip(mats, ps):
                block = p_sum[offset : offset + p.size].reshape(rows, self._rank)
                offset += p.size
                p_hat.append(np.linalg.qr(block)[0].astype(np.float32))
            local_q = [
                delta[off : off + rows * cols].reshape(rows, cols).T @ ph
                for (off, rows, cols), ph in zip(mats, p_hat)
            ]
            dense = delta[~in_mat]
            q_sum = yield np.concatenate([*(q.ravel() for q in local_q), dense])
            mean = np.empty_like(delta)
            approx = np.empty_like(delta)
            offset = 0
            for (off, rows, cols), ph, lq in zip(mats, p_hat, local_q):
                q_mean = q_sum[offset : offset + lq.size].reshape(cols, self._rank) / n
                offset += lq.size
                mean[off : off + rows * cols] = (ph @ q_mean.T).ravel()
                approx[off : off + rows * cols] = (ph @ lq.T).ravel()
            mean[~in_mat] = q_sum[offset:] / n
            approx[~in_mat] = dense
        self._error = delta - approx
        # the new agreed point; local progress since the snapshot is kept on top of it
        self._base = self._base + mean
        self._add_to_tensors(mean - (snapshot - (self._base - mean)))
        self.rounds_done += 1

    def _post(self, buf: np.ndarray) -> None:
        self._op = _HierarchicalSum(self._group, buf)

    def _drive(self) -> bool:
        """Advance the round in flight; True when none is left."""
        while self._round is not None:
            assert self._op is not None
            if not self._op.test():
                return False
            self.bytes_sent += self._op.bytes_sent
            try:
                self._post(self._round.send(self._op.result))
            except StopIteration:
                self._round = None
                self._op = None
        return True

    def _start(self) -> None:
        self._round = self._round_gen()
        self.rounds_started += 1
        self._post(next(self._round))

    def poll(self) -> None:
        """Advance the round in flight, if any (cheap; call often)."""
        if self._round is not None:
            self._drive()

    def trial_finished(self) -> None:
        """Count one finished trial; start a round when the interval is reached and no round
        is in flight (a late round is skipped rather than queued)."""
        if not self.enabled:
            return
        self._trials_since += 1
        self.poll()
        if self._trials_since >= self._interval and self._round is None:
            self._trials_since = 0
            self._start()

    def agree_rounds(self) -> int:
        """Collective over the leaders (blocking until the last leader is done with its
        trials): the number of rounds every leader must complete."""
        if not self.enabled:
            return 0
        return int(self._group.leaders.allreduce(self.rounds_started, op=_max_op()))

    def finish(self, target: int | None = None) -> None:
        """Collective over the leaders: finish the round in flight and run extra rounds so
        every leader completes the same number (blocking)."""
        if not self.enabled:
            return
        if target is None:
            target = self.agree_rounds()
        while True:
            if self._round is not None:
                while not self._drive():
                    time.sleep(0.0005)
            if self.rounds_started >= target:
                break
            self._start()


def _max_op() -> Any:
    from mpi4py import MPI

    return MPI.MAX


def broadcast_tensors(comm: Any, tensors: Sequence[Any]) -> None:
    """MPI broadcast of tensors from rank 0 of ``comm`` (in place; CPU copies for GPU)."""
    import torch

    if comm is None or comm.Get_size() == 1 or not tensors:
        return
    flat = np.concatenate([t.detach().cpu().reshape(-1).float().numpy() for t in tensors])
    flat = np.ascontiguousarray(flat, dtype=np.float32)
    comm.Bcast(flat, root=0)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(torch.from_numpy(flat[offset : offset + n]).view_as(t).to(t.dtype))
            offset += n
