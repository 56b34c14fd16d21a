"""The locks held now under a prefix (``Listing``), a lock key's value read back
(``LockRecord``), and breaking a hold (``force_release``)."""
