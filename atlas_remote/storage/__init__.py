"""Storage: `Store` over sibling backends (fsspec, local disk, obstore). See docs/architecture.md."""

from .base import Backend, Capabilities, ObjectIdentity
from .connect import connect, location
from .retry import Pace
from .settings import StoreSettings
from .store import Store

__all__ = ["Backend", "Capabilities", "ObjectIdentity", "Pace", "Store", "StoreSettings", "connect", "location"]
