"""Tests of the test harness itself (tests/support/): servers, topologies, the proxy,
forked children."""
