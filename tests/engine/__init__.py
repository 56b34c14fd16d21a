"""Tests of django_distlock.engine, mirroring it: a leaf module ``engine/X.py`` in
``tests/engine/test_X.py``, a module ``engine/ROOM/X.py`` in
``tests/engine/ROOM/test_X.py``, and ``test_X_<aspect>.py`` beside it for its larger
themes (``locks/test_lock_waiting.py``, ``renewal/test_watchdog_forcing.py``)."""
