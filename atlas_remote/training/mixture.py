"""Several datasets read as one epoch, each giving its share: by proportion, by repeat (upsampling), or a fixed
number per epoch (the three forms MosaicML Streaming offers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..format.spec import Layout
from .plan import shares
from .runs import Source


class Mixture:
    """Datasets (on any URLs and stores) mixed into one epoch, for `ShuffledStream`.

    Give exactly one of:
    - `weights`: each dataset's proportion of the epoch, which holds `epoch_size` examples (by default as many
      as all the datasets hold together);
    - `repeat`: how many times each dataset's examples are served per epoch (2.5: every example twice, half of
      them a third time; 0.5: a different half each epoch);
    - `choose`: how many examples of each dataset an epoch serves.
    A dataset asked for more examples than it holds is served whole, as often as that takes, then in part;
    asked for fewer, a different part each epoch. The order is deterministic for (seed, epoch), and every prefix
    of an epoch holds each dataset's share to within one window. `names` label the datasets (default: their
    URLs); `ShuffledStream(..., with_source=True)` says which one each example came from.
    """

    def __init__(
        self,
        datasets: Sequence[Any],
        weights: Sequence[float] | None = None,
        *,
        repeat: Sequence[float] | None = None,
        choose: Sequence[int] | None = None,
        epoch_size: int | None = None,
        names: Sequence[str] | None = None,
    ) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("a mixture needs at least one dataset")
        given = [
            name for name, value in (("weights", weights), ("repeat", repeat), ("choose", choose)) if value is not None
        ]
        if len(given) > 1:
            raise ValueError(f"give one of weights, repeat or choose, not {' and '.join(given)}")
        for name, value in (("weights", weights), ("repeat", repeat), ("choose", choose), ("names", names)):
            if value is not None and len(value) != len(self.datasets):
                raise ValueError(f"{name} has {len(value)} entries for {len(self.datasets)} datasets")
        if any(v < 0 for v in (repeat or ())) or any(v < 0 for v in (choose or ())):
            raise ValueError("repeat and choose must be >= 0")
        if epoch_size is not None and (weights is None or epoch_size < 0):
            raise ValueError("epoch_size goes with weights, and must be >= 0")
        self.weights = list(weights) if weights is not None else None
        self.repeat, self.choose, self.epoch_size = repeat, choose, epoch_size
        self.names = list(names) if names is not None else [str(getattr(d, "url", i)) for i, d in enumerate(datasets)]

    def counts(self, lengths: Sequence[int]) -> list[int]:
        """How many examples each dataset gives an epoch, given how many each holds."""
        if self.repeat is not None:
            return [round(r * n) for r, n in zip(self.repeat, lengths)]
        if self.choose is not None:
            return [int(c) for c in self.choose]
        total = sum(lengths) if self.epoch_size is None else self.epoch_size
        return shares(self.weights, total) if self.weights is not None else list(lengths)

    def asked(self) -> list[bool]:
        """Whether each dataset is asked for a share of the epoch at all (a weight, repeat or count above 0)."""
        given = self.weights if self.weights is not None else self.repeat if self.repeat is not None else self.choose
        return [v > 0 for v in given] if given is not None else [True] * len(self.datasets)

    def sources(self, layouts: Sequence[Layout]) -> list[Source]:
        return [Source(layout, count) for layout, count in zip(layouts, self.counts([len(x) for x in layouts]))]

    def __len__(self) -> int:
        """Examples of one epoch: each dataset's count (an empty dataset gives none)."""
        lengths = [len(d) for d in self.datasets]
        return sum(count for count, n in zip(self.counts(lengths), lengths) if n)

    def __repr__(self) -> str:
        form = (
            f"weights={self.weights}"
            if self.weights is not None
            else f"repeat={self.repeat}"
            if self.repeat is not None
            else f"choose={self.choose}"
            if self.choose is not None
            else "whole"
        )
        return f"Mixture({self.names}, {form})"
