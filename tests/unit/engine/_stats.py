"""Helpers shared by the sampler and verifier tests."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _single_thread() -> Iterator[None]:
    """These tests run many small ops: on 2 shared (often oversubscribed)
    cores, intra-op threads spin and wait far longer than they compute. Results
    do not depend on the thread count; restore it for whoever runs next."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def chisquare_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit (no scipy here): P(X^2_df >= stat)."""
    counts = counts.double().flatten()
    expected = probs.double().flatten() * counts.sum()
    keep = expected > 0
    if bool((counts[~keep] > 0).any()):
        return 0.0  # a zero-probability outcome happened
    stat = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2.0))
