"""What operators use, over the clients: the read views of queues, runs, leases, workers and
flows (``queries``, ``listing``, ``flow_queries``, ``gauges``, ``server_info``), the repairs
(``repair``, ``repartition``, ``workers``' pruning) and ``jobqueue check``'s readers
(``health``, ``coverage``, ``capacity``, ``scheduler_checks``). App code uses
``jobqueue.client``; nothing there imports this package."""
