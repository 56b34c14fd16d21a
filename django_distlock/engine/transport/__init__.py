"""Talking to Redis: the backend, which pool serves a key, the rules every request
follows, the sync and async drivers that carry the protocol's steps out, what
``min_replicas`` knows, and the server's eviction policy."""
