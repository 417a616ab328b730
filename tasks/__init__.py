"""Thin Prefect tasks over the day0 engine."""
