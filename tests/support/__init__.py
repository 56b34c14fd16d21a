"""Django-free support code for the tests: a TCP proxy that stalls, cuts or delays
connections (:mod:`tests.support.proxy`), a runner for functions in forked children
(:mod:`tests.support.forking`) and whole Sentinel, Cluster and replicated topologies
(:mod:`tests.support.topologies`). Single servers and replicas are
``tests.redis_servers.RedisServer``."""
