"""Building modules on the meta device whose tensors are adopted afterwards (load_state_dict(assign=True)).

`torch.device("meta")` alone still runs every layer's random initialiser, and on meta tensors those
are Python decompositions wrapped to disable dynamo: the first call imports torch._dynamo, inductor
and triton, 5-7 s of a worker's start on 2 cores, to initialise values that are thrown away. Inside
`skeleton()` the initialisers on meta tensors do nothing.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# What layers call to fill a fresh parameter in place: nn.init's public initialisers (kaiming_uniform_,
# normal_, ...; each hands itself to the mode whole) and the tensor methods they end in.
_INITIALISERS: frozenset[Callable[..., Any]] = frozenset(
    [getattr(torch.nn.init, name) for name in dir(torch.nn.init) if name.endswith("_") and not name.startswith("_")]
    + [torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.zero_, torch.Tensor.fill_]
)


class _SkipMetaInitialisers(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _INITIALISERS:
            target = args[0] if args else kwargs.get("tensor")  # nn.init passes it by keyword
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)


@contextlib.contextmanager
def skeleton() -> Iterator[None]:
    """Modules built inside have meta tensors of the right shapes and no initialised values."""
    with torch.device("meta"), _SkipMetaInitialisers():
        yield
