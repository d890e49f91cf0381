"""Builders and fixtures shared by unit, integration and race tests."""
