"""Fault injection: servers killed, paused, restarted, cut off or refusing; forks;
timeouts Redis cannot represent."""
