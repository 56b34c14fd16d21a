"""What the two task integrations share (Celery's :mod:`~django_distlock.celery` and
Django's tasks framework, :mod:`~django_distlock.tasks`), at the level of a run: the
options of a locked task and the lock a run holds (:mod:`.locking`), the claims of
``unique_while_queued`` kept beside the lock (:mod:`.claims`, Django-free, on the
engine's :class:`~django_distlock.engine.BesideLock`), a waiting run's claim kept alive
(:mod:`.waiting`) and deferral by need (:mod:`.deferrals`)."""
