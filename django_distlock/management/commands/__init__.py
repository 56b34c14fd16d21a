"""``manage.py distlock``."""
