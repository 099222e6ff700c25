"""Event kinds of the simulator's heap, also the order of events at the same instant (then insertion
order): a model ready at t serves an arrival at t, and an arrival at the very end of an iteration
joins the next batch. The order never depends on when an event was pushed, so a partitioned run
(``workers``) orders each instance's events exactly as a serial one."""

READY, ARRIVAL, MOVE, END, HOOK, SAMPLE = -1, 0, 1, 2, 3, 4
