"""Prefect flows wiring day0's stages."""
