"""Primitive collision detection: narrow-phase functions, the static pair table, the driver.

`FUNCTIONS[(type1, type2)] = (function, contact slots)` for every supported MuJoCo
geom-type pair (type1 <= type2); see `base` for the function contract.
"""

from . import box, primitives
from .driver import collide

FUNCTIONS = {**primitives.FUNCTIONS, **box.FUNCTIONS}

__all__ = ["FUNCTIONS", "collide"]
