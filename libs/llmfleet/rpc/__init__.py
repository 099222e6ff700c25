"""gRPC plumbing shared by every service: server bootstrap (health, reflection, tracing), channels."""

from llmfleet.rpc.channels import open_channel
from llmfleet.rpc.server import GrpcServer

__all__ = ["GrpcServer", "open_channel"]
