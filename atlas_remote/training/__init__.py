"""Training: an epoch's order as a plan from metadata alone (`runs`, `plan`), its progress as deals served
(`epoch_state`, `epochs`), mixtures (`mixture`), serving windows (`serving`), batches (`collate`), language-model
packing (`census`, `tokens`), and the torch-facing streams and samplers (`streams`, `samplers`).

`from atlas_remote.training import ShuffledStream` imports the streams (and torch) when asked for: the plan and
its state need numpy only, and `import atlas_remote` never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .samplers import BlockBatchSampler, BlockShuffleSampler
    from .streams import AtlasIterableDataset, EpochStream, ShuffledStream, TensorLoader, collate_numpy
    from .tokens import TokenStream

_LAZY = {
    "AtlasIterableDataset": "streams",
    "EpochStream": "streams",
    "ShuffledStream": "streams",
    "TensorLoader": "streams",
    "collate_numpy": "streams",
    "BlockBatchSampler": "samplers",
    "BlockShuffleSampler": "samplers",
    "TokenStream": "tokens",
}
__all__ = [
    "AtlasIterableDataset",
    "BlockBatchSampler",
    "BlockShuffleSampler",
    "EpochStream",
    "ShuffledStream",
    "TensorLoader",
    "TokenStream",
    "collate_numpy",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
