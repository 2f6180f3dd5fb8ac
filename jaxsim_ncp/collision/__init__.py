"""Primitive collision detection comes with the contact issue."""
