"""Support code for fault-injection tests, Django-free: a TCP proxy that stalls, cuts or
delays connections (:mod:`tests.support.proxy`) and a runner for functions in forked
children (:mod:`tests.support.forking`). Replica servers are started through
``tests.redis_servers.RedisServer(replica_of=...)``."""
