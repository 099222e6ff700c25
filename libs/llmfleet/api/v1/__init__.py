"""Generated gRPC stubs for llmfleet.v1 (do not edit; run `make protos`)."""
