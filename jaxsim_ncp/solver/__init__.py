"""Constraint solvers (Newton soft-constraint, interior-point NCP) come with the contact issues."""
