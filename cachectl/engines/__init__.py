"""Engines: plain library modules. They take plain values, return frozen dataclasses, and never print."""
