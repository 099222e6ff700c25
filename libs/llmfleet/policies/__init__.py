"""Pure policy objects (no I/O, no clock reads, no gRPC/asyncio): one algorithm per file.

The live services and the simulator call the very same objects.
"""
