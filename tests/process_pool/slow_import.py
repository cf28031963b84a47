"""A module that takes a second to import: preloaded, it makes a child's start-up slow on purpose."""

from __future__ import annotations

import time

time.sleep(1.0)
