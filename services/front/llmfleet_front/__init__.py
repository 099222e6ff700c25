"""The OpenAI front: the OpenAI-compatible HTTP API as its own processes, speaking the SDK's multiplexed
path to the schedulers (``main``: ``llmfleet-front``; ``backend``: ``FrontBackend``; ``scheduler_links``:
the calls per API key and replica; ``cluster_view``: what it reads from etcd; ``workers``: N processes
on one port)."""
