"""Recurring jobs: their definitions and state in Redis."""
