"""Management commands' side of the app: ``LockedCommand`` (:mod:`.locked`), the work
of each ``manage.py distlock`` subcommand (:mod:`.listing`, :mod:`.release`, :mod:`.run`,
on the holds :mod:`.holders` reads), the program runner of ``distlock run``
(:mod:`.supervisor`, Django-free), and the text of a terminal (:mod:`.terminal`,
:mod:`.durations`). ``django_distlock/management/commands/distlock.py`` is only the
command's parser.

Nothing is imported here: :mod:`.supervisor`, :mod:`.terminal` and :mod:`.durations`
import without Django's models.
"""
