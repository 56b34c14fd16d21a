"""Lease renewal: what a renewal decides (no threads) and the threads and loop timers
that carry it out, tell holders and hear force releases."""
