"""Recurring jobs, one concern a module (docs/design.md, "Code layout").

What a recurring job is and how its fires are planned (no I/O, or I/O-free steps shared by
both clients): ``definitions``, ``declarations``, ``info``, ``fires``, ``planning``, ``config``,
``layout`` (the scheduler partition count), ``steps`` (the definitions store), ``registry``
(who runs, who owns which partition) and ``sync`` (the store on a sync connection).

The scheduler daemon: ``daemon`` (the loop), ``firing``, ``draining``, ``buffered``,
``lookahead``, ``membership`` (leases of the partitions), and ``repartition`` (the operator's
change of K).

Nothing is imported here: a module of the lower layer never loads the daemon."""
