"""Primitive collision detection: narrow-phase functions, the static pair table, the driver.

`FUNCTIONS[(type1, type2)] = (function, contact slots)` for every supported MuJoCo
geom-type pair (type1 <= type2); see `base` for the function contract.
"""

from .driver import FUNCTIONS, collide, distance_function, geom_frame

__all__ = ["FUNCTIONS", "collide", "distance_function", "geom_frame"]
