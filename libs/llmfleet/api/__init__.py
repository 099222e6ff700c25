"""Generated protobuf/gRPC stubs (see tools/gen_protos.py)."""
