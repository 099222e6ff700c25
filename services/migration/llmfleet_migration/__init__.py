"""Migration coordinator: tracks per-engine KV use (later: epochs, bin packing, KV transfers)."""
