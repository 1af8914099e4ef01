"""`atlas-remote view URL`: a read-only web page over any dataset the library opens (docs/viewer.md).

`values.py` turns examples into JSON nodes, `pages.py` answers the page's questions from one open dataset,
`server.py` serves them with the page (`static/`: plain JavaScript, and uPlot for the charts, vendored so the
page works offline).
"""

from __future__ import annotations

from typing import Any

from ..read.megatron import MegatronCorpus
from ..read.reader import AtlasDataset
from .server import ViewerServer

__all__ = ["ViewerServer", "view"]


def view(
    url: str | AtlasDataset | MegatronCorpus,
    storage_options: dict[str, Any] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    **settings: Any,
) -> ViewerServer:
    """Serve the dataset's page (or a Megatron corpus's, given as `atlas_remote.megatron(...)`) in a background
    thread (from Python or a notebook); open `server.url` in a browser, `server.shutdown()` stops it. port 0: a
    free one. Settings are the reader's (ReaderOptions)."""
    ds = url if isinstance(url, (AtlasDataset, MegatronCorpus)) else AtlasDataset(url, storage_options, **settings)
    return ViewerServer(ds, host, port).start()
