"""Benchmarks: measured numbers as JSON and a markdown table (never asserted by timed tests)."""
