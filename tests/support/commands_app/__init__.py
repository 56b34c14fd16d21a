"""A test-only app with example locked management commands."""
