"""The collective operations of a data-parallel run, in one place.

Every process of an ``accelerate launch`` / ``torchrun`` run calls these with its own share; on one
process each is the identity, without touching ``torch.distributed``. They are what the step uses
to keep group statistics, loss normalisers and controllers identical on every rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import torch

if TYPE_CHECKING:
    from agent_r1.engine.session import Session

T = TypeVar("T")

__all__ = ["all_gather", "gather_padded_rows", "mean_across", "sum_across"]


def all_gather(session: Session, local: list[T]) -> list[T]:
    """Every process's items (trajectories...), in rank order, on every process."""
    if session.world == 1:
        return list(local)
    from accelerate.utils import gather_object

    gathered: list[T] = gather_object(local)
    return gathered


def gather_padded_rows(session: Session, rows: torch.Tensor, length: int) -> torch.Tensor:
    """Every process's ``[B_r, T_r]`` rows stacked in rank order on the CPU, right-padded with
    zeros to ``length`` (which must be at least every process's width)."""
    gathered = all_gather(session, [row.cpu() for row in rows])
    return torch.stack([torch.nn.functional.pad(row, (0, length - row.shape[0])) for row in gathered])


def sum_across(session: Session, values: torch.Tensor) -> torch.Tensor:
    """The elementwise sum of ``values`` over every process."""
    if session.world == 1:
        return values
    return session.accelerator.reduce(values, reduction="sum")  # type: ignore[no-any-return]


def mean_across(session: Session, value: float) -> float:
    """The mean of a float over every process."""
    if session.world == 1:
        return value
    mean = session.accelerator.reduce(torch.tensor([value], device=session.device), "mean")
    return float(mean[0])
