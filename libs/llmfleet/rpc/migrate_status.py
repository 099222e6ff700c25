"""What a migration source says when a request cannot move yet, shared by the engines (which say it) and
the migration coordinator (which counts the move as deferred, not failed).

A request that has just arrived by migration streams to nobody until the scheduler, reading the old
source's stream, follows it to its new engine. Moving it on before that would leave the scheduler
reading a stream that ended behind the request's newest copy: the client would see a token gap."""

NOT_ATTACHED = "arrived by migration and has no consumer yet"
