"""Tests of the management commands."""
