"""The randomized fault runs of issue 20, Jepsen-style: client processes of one lock
kind (:mod:`.workloads`) record every operation (:mod:`tests.support.history`) while a
seeded nemesis (:mod:`.nemesis`) injects faults into a real topology; :mod:`.runner`
starts it all and merges the histories, :mod:`.measures` reads double-holder windows and
takeover times from them, and ``tests/support/checker.py`` judges them.

Short seeded runs: ``tests/faults/test_chaos.py``; the long run: ``bench/chaos.py``.
"""
