"""Engine load as dispatchers and controllers see it.

``book``: pure accounting, an engine's last load report plus the requests dispatched to it since.
``monitor``: the WatchLoad follower (gRPC, asyncio), shared by the scheduler and the migration service;
import it as ``llmfleet.load.monitor`` (this package does not, so the pure part stays free of I/O).
"""

from llmfleet.load.book import LoadBook, LoadReport

__all__ = ["LoadBook", "LoadReport"]
