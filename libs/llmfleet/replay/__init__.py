"""Replaying a workload against a live cluster (``llmfleet load --trace/--synthetic``); pure parts.

- ``requests``: workload → the requests to send (service, synthetic prompt of the trace's length,
  ``max_tokens`` = its output length), services assigned exactly as ``llmfleet sim`` assigns them.
- ``targets``: which live services, in which order, with which SLOs and catalog model names.
- ``fleet``: what etcd said each second (engines, placement plan, migration state) and what follows
  from it: GPUs in use over time, the placement plans written.
- ``migration``: the migration leader's epochs and moves as ``report["migration"]``.
- ``report``: outcomes + samples → the ``llmfleet sim`` report schema, with the simulator's metric code.

The I/O (etcd polling, SDK/HTTP requests, timed sending) is in ``llmfleet.cli.load_sampler``,
``load_senders`` and ``load_replay``.
"""
