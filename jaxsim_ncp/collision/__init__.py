"""Primitive collision detection: narrow-phase functions, the static pair table, the driver.

`FUNCTIONS[(type1, type2)] = (function, contact slots)` for every supported MuJoCo
geom-type pair (type1 <= type2); see `base` for the function contract.
"""

from .driver import FUNCTIONS, collide

__all__ = ["FUNCTIONS", "collide"]
