"""The app whose ``tasks`` module holds the mistake."""
