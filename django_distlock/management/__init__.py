"""Management commands of django-distlock."""
