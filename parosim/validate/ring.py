"""Ring collectives as explicit point-to-point steps on torch.distributed (gloo or NCCL).

A ring of k ranks splits the buffer into k pieces (``torch.tensor_split``; piece c is the one
rank position c owns at the end, as in ``reduce_scatter_tensor``). Each step sends one piece to
the next rank and receives one from the previous rank at the same time (``batch_isend_irecv`` on
one group, as NCCL wants; on gloo the two directions go on two groups, see :func:`_pg`):

* all-gather, k-1 steps: at step t position p sends piece (p-t) and receives piece (p-t-1);
* reduce-scatter, k-1 steps: at step t position p sends its partial sum of piece (p-t-1),
  receives piece (p-t-2) and adds it in (real summation), ending with the full sum of piece p;
* all-reduce = reduce-scatter then all-gather, 2(k-1) steps.

This is the pipelined ring whose α-β cost the simulator models (Thakur, Rabenseifner & Gropp
2005): every rank sends (k-1)/k of the buffer per pass. Backends' own collectives are not always
rings (gloo's reduce-scatter is not), hence these explicit steps. Only torch is imported here,
so the module runs in rank processes on machines without the simulator's dependencies.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _pg(group, src: int, dst: int):
    """The process group carrying messages src -> dst.

    ``group`` may be a pair (up, down): messages to a higher rank use ``up``, to a lower rank
    ``down``, so the two directions between two ranks never share a group. Gloo runs the two
    directions of one pair's connection far below link rate when both carry data at once
    (measured: 4 MiB each way over a 300 Mbit/s link took 115-250 ms on one group, 115-120 ms
    split over two), which a two-rank ring does at every step.
    """
    if isinstance(group, tuple):
        return group[0] if dst > src else group[1]
    return group


def _step(send: torch.Tensor, dst: int, recv: torch.Tensor, src: int, group, me: int) -> None:
    g_out, g_in = _pg(group, me, dst), _pg(group, src, me)
    if g_out is g_in:
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, dst, g_out),
                                        dist.P2POp(dist.irecv, recv, src, g_in)])
    else:
        works = [dist.isend(send, dst, g_out), dist.irecv(recv, src, g_in)]
    for w in works:
        w.wait()


def pieces(buf: torch.Tensor, k: int) -> list[torch.Tensor]:
    """The k contiguous pieces of a flat buffer (sizes differ by at most one element)."""
    return list(torch.tensor_split(buf, k))


def ring_all_gather(buf: torch.Tensor, ring: tuple[int, ...], me: int, group) -> None:
    """In place: on entry piece p of ``buf`` holds this rank's data; on exit all pieces do."""
    k = len(ring)
    if k < 2:
        return
    p = ring.index(me)
    nxt, prv = ring[(p + 1) % k], ring[(p - 1) % k]
    ps = pieces(buf, k)
    for t in range(k - 1):
        _step(ps[(p - t) % k], nxt, ps[(p - t - 1) % k], prv, group, me)


def ring_reduce_scatter(buf: torch.Tensor, ring: tuple[int, ...], me: int, group,
                        scratch: torch.Tensor | None = None) -> torch.Tensor:
    """In place: on exit piece p of ``buf`` is the sum over the ring of everyone's piece p.

    Returns that piece (a view). Other pieces hold partial sums afterwards.
    """
    k = len(ring)
    ps = pieces(buf, k)
    if k < 2:
        return ps[0]
    p = ring.index(me)
    nxt, prv = ring[(p + 1) % k], ring[(p - 1) % k]
    big = max(x.numel() for x in ps)
    if scratch is None or scratch.numel() < big:
        scratch = torch.empty(big, dtype=buf.dtype, device=buf.device)
    for t in range(k - 1):
        into = ps[(p - t - 2) % k]
        tmp = scratch[: into.numel()]
        _step(ps[(p - t - 1) % k], nxt, tmp, prv, group, me)
        into.add_(tmp)
    return ps[p]


def ring_all_reduce(buf: torch.Tensor, ring: tuple[int, ...], me: int, group,
                    scratch: torch.Tensor | None = None) -> None:
    """In place: reduce-scatter then all-gather, the 2(k-1)-step ring all-reduce."""
    ring_reduce_scatter(buf, ring, me, group, scratch)
    ring_all_gather(buf, ring, me, group)


# -- backend-native equivalents (what the library itself does on the ring's group) ----------

def _one(group):
    return group[0] if isinstance(group, tuple) else group


def native_all_gather(buf: torch.Tensor, ring: tuple[int, ...], me: int, group) -> None:
    k = len(ring)
    if k < 2:
        return
    p = ring.index(me)
    ps = pieces(buf, k)
    if all(x.numel() == ps[0].numel() for x in ps):
        dist.all_gather_into_tensor(buf, ps[p].clone(), group=_one(group))
    else:
        dist.all_gather([x for x in ps], ps[p].clone(), group=_one(group))


def native_reduce_scatter(buf: torch.Tensor, ring: tuple[int, ...], me: int, group) -> None:
    k = len(ring)
    if k < 2:
        return
    p = ring.index(me)
    ps = pieces(buf, k)
    out = torch.empty_like(ps[p])
    if all(x.numel() == ps[0].numel() for x in ps):
        dist.reduce_scatter_tensor(out, buf, group=_one(group))
    else:
        dist.reduce_scatter(out, [x for x in ps], group=_one(group))
    ps[p].copy_(out)


def native_all_reduce(buf: torch.Tensor, ring: tuple[int, ...], me: int, group) -> None:
    if len(ring) >= 2:
        dist.all_reduce(buf, group=_one(group))
