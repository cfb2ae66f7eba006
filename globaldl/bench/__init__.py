"""Benchmarks: measured numbers written as JSON and a markdown table (never asserted by timed tests)."""
