"""The same helpers without the pytest fixtures: ``LockTestHelper.start()`` in a Django
``TestCase`` (a private server of its own; run here by pytest, and by ``manage.py
test``)."""

# A unittest TestCase, as Django users write them: its own assert methods.
# ruff: noqa: PT009, PT027

from __future__ import annotations

from django.test import TestCase

from django_distlock import LockBackendUnavailable, LockLost, distlock
from django_distlock.testing import LockTestHelper


class LockedCodeTests(TestCase):
    def setUp(self) -> None:
        self.locks = LockTestHelper.start()
        self.addCleanup(self.locks.stop)

    def test_a_lock_held_elsewhere_is_not_taken(self) -> None:
        with self.locks.hold("report:1"):
            self.assertFalse(distlock("report:1", blocking=False).acquire())
        self.assertEqual(self.locks.held(), [])

    def test_a_lost_lock_fails_the_block(self) -> None:
        with self.assertRaises(LockLost), distlock("report:1") as lock:
            self.locks.lose("report:1")
            self.assertTrue(lock.lost)

    def test_an_outage(self) -> None:
        with self.locks.unavailable(), self.assertRaises(LockBackendUnavailable):
            distlock("report:1").acquire()
        with distlock("report:1"):
            self.assertEqual(self.locks.held(), ["report:1"])
