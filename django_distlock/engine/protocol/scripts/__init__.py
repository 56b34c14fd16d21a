"""The Lua scripts behind every lock operation, each one round trip.

Every script lists the keys and arguments it takes and what it returns. The key layout
they assume is built by :class:`django_distlock.engine.keys.LockKeys`: the keys of one
lock, its bucket's listing index and its waiters' lists share one Redis Cluster hash tag
(the lock's bucket), so a script only ever touches one slot.

Every key a script touches is one of its ``KEYS``, used as such (never built in the
script from another key): Redis Cluster routes on the declared keys, and managed
cluster proxies refuse scripts that compute key names. The one key a script cannot know
in advance, the wake-up list of the first fair waiter, is returned to the caller, who
pushes to it with :data:`WAKE`.

An exclusive hold (the default) makes the lock key one string, ``token \\n fence \\n
acquired_at_us \\n lease_ms \\n owner_json``, so acquiring is a single ``SET ... PX`` and a
holder check is a prefix comparison. Shared and limited holds (``shared=True``,
``limit=N``) make it a sorted set instead: member = token, score = that holder's lease
end (server ms), with each holder's ``fence \\n acquired_at_us \\n lease_ms \\n
owner_json`` in the holders' hash (field ``#kind``: ``shared`` or ``limited N``). Both
keys expire with the last holder's lease, and a holder whose lease is over counts as
gone at once (every script drops such holders before it counts). The key's type is
what tells the kinds apart, so an exclusive acquire of a free lock costs what it did.

The scripts live by what they serve: :mod:`.lua` (the ``Script`` type and the Lua
fragments the scripts share), :mod:`.exclusive` (a plain lock), :mod:`.holders` (shared
and limited holds), :mod:`.many` (several names at once) and :mod:`.listing` (the
locks held now).
"""

from .exclusive import ACQUIRE, EXTEND, PASS_ON, RELEASE, TTL, WAKE
from .holders import HOLDER_ACQUIRE, HOLDER_EXTEND, HOLDER_RELEASE, HOLDER_TTL
from .listing import LIST_BUCKETS, LIST_INDEX
from .lua import NOW, Script
from .many import MANY_ACQUIRE

__all__ = [
    "ACQUIRE",
    "EXTEND",
    "HOLDER_ACQUIRE",
    "HOLDER_EXTEND",
    "HOLDER_RELEASE",
    "HOLDER_TTL",
    "LIST_BUCKETS",
    "LIST_INDEX",
    "MANY_ACQUIRE",
    "NOW",
    "PASS_ON",
    "RELEASE",
    "TTL",
    "WAKE",
    "Script",
]
